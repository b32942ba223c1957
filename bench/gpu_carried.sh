# Sourced by the GPU machine scripts: `carried NAME` prints the device_carry folder NAME, carried in
# this call or staged on this machine by an earlier one (bench/gpu_stage.sh), or fails saying so.
carried() {
    for folder in "device_carry/$1" "/tmp/device_carry/$1"; do
        if [ -d "$folder" ]; then echo "$folder"; return; fi
    done
    echo "device_carry/$1 is neither carried nor staged (make device-carry*, bench/gpu_stage.sh)" >&2
    return 1
}
