#!/usr/bin/env bash
# Where a constrained step's time goes at 64-256 clients on the GPU machine (issue 51): the step loop
# and the post-processor in one process, random Llama-3.2-1B-shaped weights in bf16, the real
# Llama 3.2 tokenizer (vocab 128256); free, one shared schema, a JSONSchemaBench schema per request.
#   make device-carry device-carry-llama                      # here
#   bash bench/gpu_step_breakdown.sh [bench.step_breakdown options]   # there: carry device_carry
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_setup.sh
rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -d /tmp/model_llama/tokenizer.json.xz
"$PY" -m bench.step_breakdown --device cuda --random-model /tmp/model_llama --shape llama-3.2-1b \
    --data device_carry/jsonschemabench --clients 64 128 256 --rounds 2 --out "$OUT" "$@"
