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
source bench/gpu_setup.sh
tar -xJf device_carry/triton/site.tar.xz -C "$SITE"
# That machine's scipy (and scikit-learn on it) needs numpy 2, which the pytriton stub cannot use;
# transformers imports them only when installed: hide them from every process here.
echo 'import sys; [sys.modules.setdefault(name, None) for name in ("scipy", "sklearn")]' > "$SITE/sitecustomize.py"
# The python backend stub ignores PYTHONPATH and sees the venv's site-packages only (through
# EXECUTION_ENV_PATH): a .pth file there puts our packages first for it too (this machine is scratch).
PURELIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import sys; sys.path[:0] = ['$SITE', '$PWD']" > "$PURELIB/00-llgtriton-gpu.pth"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then GPUS=(0 1); else GPUS=(0 0); fi
nvidia-smi -L
"$PY" -m bench.replicas --random-model device_carry/model --shape llama-3.2-1b --device cuda \
    --gpus "${GPUS[@]}" --out "$OUT" "$@" || { tail -n 40 "$OUT"/*.log; exit 1; }
