#!/usr/bin/env bash
# Engine, Triton and the proxy side by side on the GPU machine (issue 41): random weights of a
# Llama-3.2-1B shape in bf16 with the real Llama 3.2 tokenizer (vocab 128256), free and
# JSON-schema-constrained, 1-256 streaming clients, Triton's engine in a process of its own (on,
# the default) or in the python stub (off). The engine and Triton layers are driven by our own
# clients, Triton also by perf_analyzer, the proxy by aiperf (out of process); then the plot.
#   make device-carry device-carry-triton device-carry-llama device-carry-aiperf device-carry-perf-analyzer  # here
#   bash bench/gpu_stage.sh aiperf perf_analyzer  # there, first: carry device_carry/{aiperf,perf_analyzer}
#   [NAME=report] bash bench/gpu_serving.sh [on|off] [bench.layers options]  # then: carry device_carry/{wheels,triton,model_llama}
set -euo pipefail
MODE=${1:-on}
[ $# -gt 0 ] && shift
OUT=${OUT:-docs/results}
NAME=${NAME:-serving_$MODE}
mkdir -p "$OUT"

source bench/gpu_serving_env.sh

"$PY" -m bench.layers --random-model /tmp/model_llama --device cuda --core-process "$MODE" \
    --name "$NAME" --out "$OUT" --concurrency 1 8 32 64 128 256 --requests 4 --max-tokens 64 \
    --max-batch-size 256 --layers engine triton \
    --perf-analyzer "$PERF_ANALYZER" \
    --aiperf "env LLGTRITON_PLAIN_PYTHON=1 PYTHONPATH=$AIPERF_SITE $PY -m aiperf" "$@" ||
    { tail -n 60 "$OUT"/*.log; exit 1; }
"$PY" -m bench.plot_serving "$OUT/$NAME.png" "$OUT/$NAME.json"
