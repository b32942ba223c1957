#!/usr/bin/env bash
# Constrained vs unconstrained decoding on the GPU machine: the step scheduler with llguidance and
# the CUDA mask kernel, a random-weight Llama-3.2-1B-shaped model (real weights do not travel;
# SmolLM2's tokenizer, vocab 49152), JSON schemas from JSONSchemaBench.
#   bash bench/gpu_tbt.sh               # results in docs/results/ (or $OUT)
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_setup.sh
DATA=device_carry/jsonschemabench  # shared/ does not travel; make device-carry copies the schemas
"$PY" -m bench.tbt_overhead --device cuda --random-model device_carry/model --shape llama-3.2-1b \
    --data "$DATA" --batches 1 8 32 64 128 --rounds 6 --out "$OUT" "$@"
