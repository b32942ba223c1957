#!/usr/bin/env bash
# Direct Triton gRPC vs the OpenAI proxy on the GPU machine's 16 cores (issue 8), where the
# tritonserver, the python stub, the proxy and the load generator do not share 2 cores. The
# synthetic engine loads no model, so the GPU is idle: this measures the layers above it.
#   make device-carry device-carry-triton    # here, once
#   bash bench/gpu_proxy_overhead.sh         # there; results in $OUT/proxy_overhead_gpu_machine.json
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_triton_env.sh
nproc
"$PY" -m bench.proxy_overhead --out "$OUT/proxy_overhead_gpu_machine.json" "$@"
