#!/usr/bin/env bash
# The GPU kernel's tests and benchmark, as one command on the GPU machine (no network there).
#
# What that machine lacks travels in device_carry/ (`make device-carry` fills it from PyPI and the
# model cache): the PyCUDA sdist, its pure-Python dependencies, pytest, llguidance, pydantic, the
# xgrammar wheel whose kernels we compare against, and SmolLM2's config and tokenizer files.
#   bash bench/gpu_kernel.sh            # results in docs/results/ (or $OUT)
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_setup.sh
rm -rf /tmp/xgrammar && "$PY" -m zipfile -e device_carry/wheels/xgrammar-*.whl /tmp/xgrammar
status=0
"$PY" -m pytest -c /dev/null --confcutdir=tests/gpu -p no:cacheprovider -q -rs tests/gpu || status=$?
"$PY" -m bench.mask_kernel --xgrammar /tmp/xgrammar --out "$OUT" "$@" || status=$?
exit $status
