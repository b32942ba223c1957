#!/usr/bin/env bash
# Two Triton replicas behind one proxy on the GPU machine (issue 6): one replica per GPU when the
# machine has two or more, else two instances on its one GPU. Each serves random weights of a
# Llama-3.2-1B shape (real weights do not travel) with SmolLM2's tokenizer, through the real
# tritonserver and python backend, the torch engine and the CUDA mask kernel.
#   make device-carry device-carry-triton    # here, once
#   bash bench/gpu_replicas.sh               # there; results in docs/results/replicas.json (or $OUT)
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_triton_env.sh
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then GPUS=(0 1); else GPUS=(0 0); fi
nvidia-smi -L
"$PY" -m bench.replicas --random-model device_carry/model --shape llama-3.2-1b --device cuda \
    --gpus "${GPUS[@]}" --out "$OUT" "$@" || { tail -n 40 "$OUT"/*.log; exit 1; }
