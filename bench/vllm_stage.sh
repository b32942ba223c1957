#!/usr/bin/env bash
# vLLM 0.26.0 for the GPU machine (issue 42), which has no network and takes at most 64 MiB a call.
# What its image already holds (bench/gpu_image_packages.txt, as read there on 2026-11-17: torch
# 2.11, transformers, numpy, ...) stays out; the rest travels as 50 MiB parts (with the working tree, under a call's 64 MiB) of one tar.
#   bash bench/vllm_stage.sh download   # here: device_carry/vllm/part00, part01, ... (uv resolves)
#   bash bench/vllm_stage.sh stage      # there, one call per part: carry device_carry/vllm/partNN
#   bash bench/vllm_stage.sh install    # there, after the last part: vLLM in /tmp/vllm-site
set -euo pipefail
STAGE=device_carry/vllm
case ${1:?say download, stage or install} in
download)
    BIN=${BIN:-.venv/bin}
    WORK=$(mktemp -d) && trap 'rm -rf "$WORK"' EXIT
    echo "vllm==0.26.0" > "$WORK/in.txt"
    "$BIN/uv" pip compile -q "$WORK/in.txt" --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
        --no-header --no-annotate -o "$WORK/all.txt"
    # Names compare normalized (PEP 503); torch's own CUDA libraries are the image's too.
    normalize() { tr '[:upper:]_.' '[:lower:]--'; }
    normalize < bench/gpu_image_packages.txt > "$WORK/image.txt"
    sed 's/==.*//' "$WORK/all.txt" | normalize | paste -d' ' - "$WORK/all.txt" |
        grep -v -w -F -f "$WORK/image.txt" | grep -v -E '^(torch|nvidia-|cuda-)' | cut -d' ' -f2 > "$WORK/missing.txt"
    "$BIN/pip" download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
        -d "$WORK/wheels" -r "$WORK/missing.txt"
    rm -rf "$STAGE" && mkdir -p "$STAGE"
    tar -C "$WORK/wheels" -cf - . | split -b 50M -d - "$STAGE/tar."
    for part in "$STAGE"/tar.*; do mkdir "$STAGE/part${part##*.}" && mv "$part" "$STAGE/part${part##*.}/"; done
    wc -l < "$WORK/missing.txt" | xargs echo "wheels:"
    du -sh "$STAGE"/part* ;;
stage)
    mkdir -p /tmp/vllm-parts && cp "$STAGE"/part*/tar.* /tmp/vllm-parts/ && ls -l /tmp/vllm-parts ;;
install)
    rm -rf /tmp/vllm-wheels && mkdir -p /tmp/vllm-wheels
    cat /tmp/vllm-parts/tar.* | tar -x -C /tmp/vllm-wheels
    "${PY:-/opt/torch/.venv/bin/python}" -m pip install -q --no-index --no-deps --upgrade --target /tmp/vllm-site \
        /tmp/vllm-wheels/*.whl
    PYTHONPATH=/tmp/vllm-site "${PY:-/opt/torch/.venv/bin/python}" -c "import vllm; print('vllm', vllm.__version__)" ;;
*) echo "say download, stage or install" >&2; exit 2 ;;
esac
