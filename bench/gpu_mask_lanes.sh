#!/usr/bin/env bash
# Issue 51 on the GPU machine, the engine alone (bench.step_breakdown, random Llama-3.2-1B-shaped
# weights, the Llama 3.2 tokenizer): a grammar's requests copying one compiled template or one per
# lane, forced text read through Python or by llguidance's own tokenizer, and the decode queued
# before or after a step's tokens are delivered. Each PART fits one 10-minute call:
#   make device-carry device-carry-llama                    # here
#   PART=lanes bash bench/gpu_mask_lanes.sh                 # there: carry device_carry/{wheels,model_llama,jsonschemabench,pycuda_site}
#   PART=launch bash bench/gpu_mask_lanes.sh
#   PART=switch bash bench/gpu_mask_lanes.sh               # launched ahead or not, under 5 and 1 ms switch intervals
#   PART=masks bash bench/gpu_mask_lanes.sh                # launched ahead, masks on the worker or the step loop
set -euo pipefail
OUT=${OUT:-docs/results}
PART=${PART:-lanes}
mkdir -p "$OUT" /tmp/llgtriton-site
if [ -f device_carry/pycuda_site/pycuda_site.tgz ]; then  # PyCUDA built on an earlier lease: no 100 s build
    tar xzf device_carry/pycuda_site/pycuda_site.tgz -C /tmp/llgtriton-site
fi
source bench/gpu_setup.sh
if [ ! -f /tmp/model_llama/tokenizer.json ]; then
    rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -df /tmp/model_llama/tokenizer.json.xz
fi
COMMON=(--device cuda --random-model /tmp/model_llama --shape llama-3.2-1b --data device_carry/jsonschemabench
    --out "$OUT" --clients 64 256 --rounds 2 --kinds free shared own)
case "$PART" in
lanes) "$PY" -m bench.step_breakdown "${COMMON[@]}" --launch-ahead off --lanes 1 16 --plain-tokenizer off on \
    --name mask_lanes_h200 ;;
launch) "$PY" -m bench.step_breakdown "${COMMON[@]}" --launch-ahead off on --name launch_ahead_h200 ;;
switch) "$PY" -m bench.step_breakdown "${COMMON[@]}" --launch-ahead off on --switch-intervals 0.005 0.001 \
    --name launch_ahead_switch_h200 ;;
masks) "$PY" -m bench.step_breakdown "${COMMON[@]}" --kinds free shared own tools --launch-ahead on \
    --masks-on worker step-loop --name masks_on_h200 ;;
*) echo "PART is lanes, launch, switch or masks" >&2 && exit 2 ;;
esac
