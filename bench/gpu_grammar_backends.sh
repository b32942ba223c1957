#!/usr/bin/env bash
# llguidance as llgtriton calls it against xgrammar as vLLM and TensorRT-LLM call it, on the GPU
# machine's CPU cores (issue 42): bench/grammar_backends.py over JSONSchemaBench, Llama 3.2's tokenizer.
#   make device-carry device-carry-llama   # here, once
#   bash bench/gpu_grammar_backends.sh     # there; carry device_carry/{wheels,xgrammar,jsonschemabench,model_llama}
#                                          # (or stage some with bench/gpu_stage.sh first)
set -euo pipefail
PY=${PY:-/opt/torch/.venv/bin/python}
OUT=${OUT:-docs/results}
source bench/gpu_carried.sh
WHEELS=$(carried wheels)
SITE=/tmp/grammar-backends-site
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$(carried xgrammar)"/*.whl \
    "$WHEELS"/{llguidance,xgrammar,pydantic,pydantic_core,annotated_types,typing_inspection}-*.whl
rm -rf /tmp/model_llama_tokenizer && cp -r "$(carried model_llama)" /tmp/model_llama_tokenizer
PYTHONPATH="$SITE:$PWD" "$PY" -m bench.grammar_backends --model /tmp/model_llama_tokenizer \
    --data "$(carried jsonschemabench)" --out "$OUT" --name grammar_backends_gpu_machine "$@"
