# The two commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every package `make install` takes is pinned, with its hashes, in requirements/lock.txt (`make lock`),
# except torch: requirements/torch.txt pins it by name, so this machine kind takes the CPU build it
# keeps on disk and another machine the registry's. The no-deps wheels have a lock of their own.
LOCK := requirements/lock.txt
NO_DEPS_LOCK := requirements/no-deps.txt
TORCH_PIN := requirements/torch.txt
STAMP := $(VENV)/.installed
# Where `make lock` finds the torch CPU build, so the lock takes its dependencies, not CUDA's.
TORCH_FIND_LINKS ?= /opt/wheels
LATEST_VENV ?= .venv-latest
# The client libraries of the client suite (tests/clients), pinned in a lock and a venv of their own.
CLIENTS_VENV ?= .venv-clients
CLIENTS_LOCK := requirements/clients.txt
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed

.PHONY: install serve test test-latest lock lint typecheck unit e2e device-carry device-carry-triton device-carry-llama device-carry-aiperf device-carry-perf-analyzer clean

$(STAMP): pyproject.toml Makefile $(LOCK) $(NO_DEPS_LOCK) $(TORCH_PIN)
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --require-hashes --no-deps -r $(LOCK) -r $(NO_DEPS_LOCK)
	$(BIN)/pip install -r $(TORCH_PIN)
	$(BIN)/pip install --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(CLIENTS_STAMP): $(CLIENTS_LOCK)
	$(PYTHON) -m venv --clear $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install --quiet --require-hashes --no-deps -r $(CLIENTS_LOCK)
	touch $(CLIENTS_STAMP)

install: $(STAMP) $(CLIENTS_STAMP)

serve: $(STAMP)
	$(BIN)/llgtriton serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m "not e2e and not gpu"

e2e: $(STAMP) $(CLIENTS_STAMP)
	$(BIN)/pytest -m e2e

# Two workers, a test file each at a time (its servers are started once). schemathesis's tests run
# apart: under xdist it makes one test of its operations, not one each.
OPENAPI_TESTS := tests/proxy/test_openapi.py
test: lint typecheck $(CLIENTS_STAMP)
	$(BIN)/pytest -m "not gpu" --numprocesses 2 --dist loadfile --ignore $(OPENAPI_TESTS)
	$(BIN)/pytest -m "not gpu" $(OPENAPI_TESTS)

# Refresh the locks from the newest releases in pyproject.toml's ranges; then run `make test` and commit.
lock: $(STAMP)
	$(BIN)/uv pip compile --quiet pyproject.toml requirements/tools.in --extra proxy --extra backend --extra dev \
		--upgrade --generate-hashes --python-version 3.11 --find-links $(TORCH_FIND_LINKS) \
		--constraint $(TORCH_PIN) --no-emit-package torch --custom-compile-command "make lock" --output-file $(LOCK)
	$(BIN)/uv pip compile --quiet pyproject.toml --extra proxy --constraint $(LOCK) \
		--generate-hashes --python-version 3.11 --custom-compile-command "make lock" --output-file requirements/proxy.txt
	$(BIN)/uv pip compile --quiet pyproject.toml --extra proxy --extra backend --constraint $(LOCK) \
		--find-links $(TORCH_FIND_LINKS) --constraint $(TORCH_PIN) --no-emit-package torch \
		--generate-hashes --python-version 3.11 --custom-compile-command "make lock" --output-file requirements/serve.txt
	$(BIN)/uv pip compile --quiet pyproject.toml --extra clients --override requirements/clients-overrides.txt \
		--upgrade --generate-hashes --python-version 3.11 --custom-compile-command "make lock" --output-file $(CLIENTS_LOCK)
	$(BIN)/uv pip compile --quiet requirements/no-deps.in --no-deps --upgrade --generate-hashes --python-version 3.11 \
		--custom-compile-command "make lock" --output-file $(NO_DEPS_LOCK)

# The unit tests in a throwaway venv of the newest releases (torch stays pinned): an upstream change
# shows up here, by name, before a user meets it. It does not gate `make test`.
test-latest:
	$(PYTHON) -m venv --clear $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install --upgrade pip
	$(LATEST_VENV)/bin/pip install -r $(TORCH_PIN)
	$(LATEST_VENV)/bin/pip install --constraint $(TORCH_PIN) -e ".[proxy,backend,dev]"
	$(LATEST_VENV)/bin/pip install --no-deps -r requirements/no-deps.in
	$(LATEST_VENV)/bin/pip list --format freeze
	$(LATEST_VENV)/bin/pytest -m "not e2e and not gpu" -p no:cacheprovider \
		--deselect tests/test_locks.py::test_this_environment_holds_the_lock

# Wheels and sources the GPU machine lacks (it has no network), for bench/gpu_kernel.sh. pydantic and
# pydantic-core are pinned to the venv's: unpinned, --no-deps takes the newest pydantic-core with a
# wheel for these tags (once a 0.0.1 stub).
device-carry:
	mkdir -p device_carry/wheels
	$(BIN)/pip download --no-deps --no-build-isolation --no-binary :all: -d device_carry/wheels pycuda==2026.1
	$(BIN)/pip download --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 \
		-d device_carry/wheels \
		pytools platformdirs mako markupsafe siphash24 typing_extensions pytest pluggy iniconfig packaging \
		xgrammar==0.2.8 llguidance==1.9.1 annotated-types typing-inspection \
		jsonschema jsonschema-specifications referencing rpds-py attrs \
		$$($(BIN)/python -c "import pydantic, pydantic_core as c; print(f'pydantic=={pydantic.VERSION} pydantic-core=={c.__version__}')") \
		$$($(BIN)/python -c "from importlib.metadata import version as v; print(*(f'{n}=={v(n)}' for n in ('starlette', 'anyio', 'sniffio', 'idna')))")  # bench.tool_requests reads answers as the proxy does
	$(BIN)/pip download --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 -d device_carry/xgrammar apache-tvm-ffi==0.1.15.post2  # xgrammar's, to import it
	mkdir -p device_carry/model
	cp -r ../shared/data/jsonschemabench device_carry/
	$(BIN)/python -c "from backend.model_loader import checkpoint_path; from llgtriton.settings import EngineSettings; print(checkpoint_path(EngineSettings()))" \
		| xargs -I{} cp {}/config.json {}/tokenizer.json {}/tokenizer_config.json {}/generation_config.json \
		{}/chat_template.jinja device_carry/model/

# tritonserver, numpy 1.26 and the proxy's wheels for the GPU machine (bench/gpu_replicas.sh).
device-carry-triton: $(STAMP)
	BIN=$(BIN) bash bench/device_carry_triton.sh

# A Llama-3.2-1B-shaped model folder with the real Llama 3.2 tokenizer, for bench/gpu_serving.sh.
device-carry-llama: $(STAMP)
	$(BIN)/python -m bench.llama_model device_carry/model_llama
	xz -9 -f device_carry/model_llama/tokenizer.json  # 9 MB to 2: the carry holds 64 MiB

# aiperf for the GPU machine (bench/gpu_serving.sh): it and the dependencies that machine's image lacks
# (docs/benchmarks.md lists what it has), about 10 MB; pydantic comes from device_carry/wheels.
AIPERF_WHEELS = aiperf==0.13.0 crick==0.0.8 cyclopts==4.25.3 docstring-parser==0.18.0 rich-rst==2.2.0 \
	msgspec==0.22.0 orjson==3.11.9 pydantic-settings==2.16.3 python-dotenv==1.2.4 pyzmq==26.4.0 \
	ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 setproctitle==1.3.8 ffmpeg-python==0.2.0 future==1.0.0
device-carry-aiperf: $(STAMP)
	mkdir -p device_carry/aiperf
	$(BIN)/pip download --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 \
		-d device_carry/aiperf $(AIPERF_WHEELS)

# perf_analyzer for the GPU machine (bench/gpu_layers.sh); its wheel needs glibc 2.38, which that machine has.
device-carry-perf-analyzer: $(STAMP)
	mkdir -p device_carry/perf_analyzer
	$(BIN)/pip download --no-deps --only-binary :all: --python-version 3.12 --platform manylinux_2_38_x86_64 \
		-d device_carry/perf_analyzer perf_analyzer==2.60.0

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(CLIENTS_VENV) .mypy_cache .ruff_cache .pytest_cache
