# Sourced by the GPU machine scripts: installs what that machine lacks from device_carry/wheels
# (it has no network) into $SITE and builds PyCUDA from its sdist (~100 s, once per machine).
PY=${PY:-/opt/torch/.venv/bin/python}
SITE=/tmp/llgtriton-site
WHEELS=device_carry/wheels
mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" $(ls "$WHEELS"/*.whl | grep -v -e xgrammar) 2>/dev/null
# NO_PYCUDA=1 skips that build, for runs that need no kernel (bench/gpu_proxy_overhead.sh).
if [ -z "${NO_PYCUDA:-}" ] && ! PYTHONPATH="$SITE" "$PY" -c "import pycuda.driver" 2>/dev/null; then
    rm -rf /tmp/pycuda-build && mkdir -p /tmp/pycuda-build
    tar -xzf "$WHEELS"/pycuda-*.tar.gz -C /tmp/pycuda-build
    (cd /tmp/pycuda-build/pycuda-* && "$PY" configure.py --cuda-root=/usr/local/cuda >/dev/null &&
        PYTHONPATH="$SITE" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" .)
fi
export PYTHONPATH="$SITE:$PWD" LLGTRITON_GPU_MODEL_DIR=device_carry/model
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
