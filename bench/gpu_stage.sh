#!/usr/bin/env bash
# Copies carried device_carry folders to /tmp/device_carry on the GPU machine, where they stay while
# the machine is held: one call carries at most 64 MiB, so a run that needs more is staged first.
#   bash bench/gpu_stage.sh aiperf perf_analyzer    # a first call, carrying device_carry/{aiperf,perf_analyzer}
set -euo pipefail
mkdir -p /tmp/device_carry
for name in "$@"; do
    rm -rf "/tmp/device_carry/$name" && cp -r "device_carry/$name" "/tmp/device_carry/$name"
done
du -sh /tmp/device_carry/*
