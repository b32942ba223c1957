# Sourced by the GPU machine scripts: `carried NAME` prints the device_carry folder NAME, carried in
# this call or staged on this machine by an earlier one (bench/gpu_stage.sh), or fails saying so.
carried() {
    for folder in "device_carry/$1" "/tmp/device_carry/$1"; do
        if [ -d "$folder" ]; then echo "$folder"; return; fi
    done
    echo "device_carry/$1 is neither carried nor staged (make device-carry*, bench/gpu_stage.sh)" >&2
    return 1
}
# `old_build`: /tmp/old, a copy of this tree with the files of device_carry/overlay laid over it (the
# build an A/B run compares this one with); device_carry itself is linked, not copied.
old_build() {
    rm -rf /tmp/old && mkdir /tmp/old && cp -r $(ls -A | grep -v -e '^device_carry$' -e '^.git$') /tmp/old/
    ln -s "$PWD/device_carry" /tmp/old/device_carry && cp -r device_carry/overlay/. /tmp/old/
}
