#!/usr/bin/env bash
# Where a constrained step's time goes at 64-256 clients on the GPU machine (issue 51): the step loop
# and the post-processor in one process, random Llama-3.2-1B-shaped weights in bf16, the real
# Llama 3.2 tokenizer (vocab 128256); free, one shared schema, a JSONSchemaBench schema per request.
# Then 256 clients free and shared again with llguidance's own tokenizer (spelled special tokens as
# the tokens), for what reading them as text costs.
#   make device-carry device-carry-llama                  # here
#   NAME=step_breakdown bash bench/gpu_step_breakdown.sh  # there: carry device_carry
set -euo pipefail
OUT=${OUT:-docs/results}
NAME=${NAME:-step_breakdown}
mkdir -p "$OUT"
source bench/gpu_setup.sh
rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -d /tmp/model_llama/tokenizer.json.xz
COMMON=(--device cuda --random-model /tmp/model_llama --shape llama-3.2-1b --data device_carry/jsonschemabench --out "$OUT")
"$PY" -m bench.step_breakdown "${COMMON[@]}" --clients 64 128 256 --rounds 2 --name "$NAME"
"$PY" -m bench.step_breakdown "${COMMON[@]}" --clients 256 --rounds 2 --kinds free shared \
    --llguidance-own-tokenizer --name "${NAME}_llguidance_tokenizer"
