#!/usr/bin/env bash
# The serving matrix (bench/gpu_serving.sh's, two stubs and four proxy workers) for two builds in one
# lease: this tree ("new") and a copy of it with the files of device_carry/overlay laid over it ("old").
#   mkdir -p device_carry/overlay/backend && git show REV:backend/x.py > device_carry/overlay/backend/x.py  # here
#   bash bench/gpu_stage.sh aiperf perf_analyzer   # there, a first call: carry device_carry/{aiperf,perf_analyzer}
#   ORDER="old new" ROUND=1 bash bench/gpu_serving_ab.sh 64 256   # then: carry device_carry/{wheels,triton,
#       model_llama,pycuda_site,overlay}; results in $OUT/ab_<build>_<round>.json
set -u
OUT=${OUT:-docs/results}
ORDER=${ORDER:-old new}
mkdir -p "$OUT"
ROOT=$PWD
source bench/gpu_serving_env.sh > "$OUT/setup.txt" 2>&1
old_build  # (bench/gpu_carried.sh, sourced by gpu_serving_env.sh)
PURELIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for build in $ORDER; do
    dir=$ROOT && [ "$build" = old ] && dir=/tmp/old
    cd "$dir"
    # The python stub finds our packages through this file (bench/gpu_triton_env.sh): this build's.
    echo "import os, sys; os.environ.get('LLGTRITON_PLAIN_PYTHON') or sys.path.__setitem__(slice(0, 0), ['$SITE', '$dir'])" \
        > "$PURELIB/00-llgtriton-gpu.pth"
    PYTHONPATH="$SITE:$dir" timeout "${TIMEOUT:-290}" "$PY" -m bench.layers --random-model /tmp/model_llama --device cuda \
        --core-process on --name "ab_${build}_${ROUND:-1}" --out "$OUT" --concurrency "$@" --requests 32 \
        --max-tokens 64 --max-batch-size 256 --layers engine triton --triton-instances 2 --proxy-workers 4 \
        --perf-analyzer "$PERF_ANALYZER" \
        --aiperf "env LLGTRITON_PLAIN_PYTHON=1 PYTHONPATH=$AIPERF_SITE $PY -m aiperf" > "$OUT/log_${build}_${ROUND:-1}.txt" 2>&1
    echo "$build: exit $?"
    cd "$ROOT"
done
