#!/usr/bin/env bash
# Engine, Triton and the proxy side by side on the GPU machine (issue 41), Triton's engine in the
# python stub (off) or in a process of its own (on): random weights of a Llama-3.2-1B shape in bf16
# with the real Llama 3.2 tokenizer (vocab 128256), free and JSON-schema-constrained, 1-256 clients.
#   make device-carry device-carry-triton device-carry-llama    # here, once
#   bash bench/gpu_serving.sh off|on [bench.layers options]     # there; carry device_carry/{wheels,triton,model_llama}
set -euo pipefail
MODE=${1:?say off or on}
shift
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_triton_env.sh
rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -d /tmp/model_llama/tokenizer.json.xz
"$PY" -m bench.layers --random-model /tmp/model_llama --device cuda --core-process "$MODE" \
    --name "serving_core_$MODE" --out "$OUT" --concurrency 1 8 32 64 128 256 --requests 4 --max-tokens 64 \
    --max-batch-size 256 "$@" || { tail -n 60 "$OUT"/*.log; exit 1; }
