#!/usr/bin/env bash
# Engine, Triton (our gRPC client and perf_analyzer) and the proxy side by side on the GPU machine
# (issue 5): the torch engine on CUDA with the mask kernel, random weights of a Llama-3.2-1B shape
# (real weights do not travel; SmolLM2's tokenizer), free and JSON-schema-constrained requests.
#   make device-carry device-carry-triton device-carry-perf-analyzer    # here, once
#   bash bench/gpu_layers.sh       # there; carry device_carry/{wheels,model,triton,perf_analyzer}
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_triton_env.sh
rm -rf /tmp/perf_analyzer && "$PY" -m zipfile -e device_carry/perf_analyzer/perf_analyzer-*.whl /tmp/perf_analyzer
chmod +x /tmp/perf_analyzer/perf_analyzer/bin/perf_analyzer
"$PY" -m bench.layers --random-model device_carry/model --shape llama-3.2-1b --device cuda \
    --perf-analyzer /tmp/perf_analyzer/perf_analyzer/bin/perf_analyzer --name layers_gpu --out "$OUT" \
    --concurrency 1 8 32 64 128 --requests 8 --max-tokens 64 "$@" || { tail -n 40 "$OUT"/*.log; exit 1; }
