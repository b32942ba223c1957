# Sourced by the GPU machine scripts that run tritonserver and the proxy there (after
# `make device-carry device-carry-triton` here): bench/gpu_setup.sh, then the trimmed
# nvidia-pytriton, numpy 1.26 and the proxy's wheels from device_carry/triton/site.tar.xz.
source bench/gpu_setup.sh
tar -xJf device_carry/triton/site.tar.xz -C "$SITE"
# That machine's scipy (and scikit-learn on it) needs numpy 2, which the pytriton stub cannot use;
# transformers imports them only when installed: hide them from every process here.
echo 'import sys; [sys.modules.setdefault(name, None) for name in ("scipy", "sklearn")]' > "$SITE/sitecustomize.py"
# The python backend stub ignores PYTHONPATH and sees the venv's site-packages only (through
# EXECUTION_ENV_PATH): a .pth file there puts our packages first for it too (this machine is scratch).
# LLGTRITON_PLAIN_PYTHON=1 keeps them out, for tools that need the machine's own numpy (aiperf).
PURELIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import os, sys; os.environ.get('LLGTRITON_PLAIN_PYTHON') or sys.path.__setitem__(slice(0, 0), ['$SITE', '$PWD'])" \
    > "$PURELIB/00-llgtriton-gpu.pth"
