#!/usr/bin/env bash
# Packs what the GPU machine lacks to run tritonserver, the python backend and the proxy there
# (it has no network): device_carry/triton/site.tar.xz, extracted on top of bench/gpu_setup.sh's
# site folder by bench/gpu_replicas.sh. Run here with `make device-carry-triton`.
#   - tritonserver, its libraries and the Python 3.12 backend stub from the installed nvidia-pytriton
#     (the libpython 3.13 it bundles and the other stubs are left out, to fit the 64 MiB carry);
#   - numpy 1.26 (the stub corrupts BYTES tensors under numpy 2, see docs/architecture.md);
#   - the proxy's (psycopg for its Responses store), the OpenAI client's and jsonschema's wheels.
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=device_carry/triton
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$OUT" "$STAGE/wheels" "$STAGE/site"

"$BIN/pip" download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$STAGE/wheels" \
    numpy==1.26.4 grpcio protobuf tritonclient python-rapidjson starlette uvicorn httptools click h11 \
    prometheus-client pyyaml anyio sniffio idna urllib3 certifi openai jiter distro httpx httpcore \
    httpx2 httpcore2 annotated-doc tqdm \
    jsonschema jsonschema-specifications referencing rpds-py attrs truststore psycopg psycopg-binary psycopg-pool
for wheel in "$STAGE"/wheels/*.whl; do
    (cd "$STAGE/site" && unzip -qo "$wheel")
done
find "$STAGE/site" -depth -type d \( -name tests -o -name __pycache__ \) -path '*numpy*' -exec rm -rf {} +

PYTRITON=$("$BIN/python" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('pytriton').origin).parent.parent)")
mkdir -p "$STAGE/site/pytriton/tritonserver/python_backend_stubs"
cp "$PYTRITON/pytriton/__init__.py" "$STAGE/site/pytriton/"
cp -r "$PYTRITON/pytriton/tritonserver/"{bin,backends,caches} "$STAGE/site/pytriton/tritonserver/"
cp -r "$PYTRITON/pytriton/tritonserver/python_backend_stubs/3.12" "$STAGE/site/pytriton/tritonserver/python_backend_stubs/"
mkdir -p "$STAGE/site/nvidia_pytriton.libs"
find "$PYTRITON/nvidia_pytriton.libs" -type f ! -name 'libpython3*' -exec cp {} "$STAGE/site/nvidia_pytriton.libs/" \;

tar -C "$STAGE/site" -cf - . | xz -T0 -9 > "$OUT/site.tar.xz"
du -h "$OUT/site.tar.xz"
