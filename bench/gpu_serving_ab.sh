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
source bench/gpu_carried.sh
if [ -d device_carry/pycuda_site ]; then  # a PyCUDA built on an earlier lease: no 100 s build
    mkdir -p /tmp/llgtriton-site && tar -xzf device_carry/pycuda_site/pycuda_site.tgz -C /tmp/llgtriton-site
fi
ROOT=$PWD
source bench/gpu_triton_env.sh > "$OUT/setup.txt" 2>&1
AIPERF_SITE=/tmp/aiperf-site
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$AIPERF_SITE" "$(carried aiperf)"/*.whl \
    device_carry/wheels/{pydantic,pydantic_core,annotated_types,typing_inspection,typing_extensions}-*.whl
rm -rf /tmp/perf_analyzer && "$PY" -m zipfile -e "$(carried perf_analyzer)"/perf_analyzer-*.whl /tmp/perf_analyzer
chmod +x /tmp/perf_analyzer/perf_analyzer/bin/perf_analyzer
rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -d /tmp/model_llama/tokenizer.json.xz
rm -rf /tmp/old && mkdir /tmp/old && cp -r $(ls -A | grep -v -e '^device_carry$' -e '^.git$') /tmp/old/
ln -s "$ROOT/device_carry" /tmp/old/device_carry && cp -r device_carry/overlay/. /tmp/old/
PURELIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for build in $ORDER; do
    dir=$ROOT && [ "$build" = old ] && dir=/tmp/old
    cd "$dir"
    # The python stub finds our packages through this file (bench/gpu_triton_env.sh): this build's.
    echo "import os, sys; os.environ.get('LLGTRITON_PLAIN_PYTHON') or sys.path.__setitem__(slice(0, 0), ['$SITE', '$dir'])" \
        > "$PURELIB/00-llgtriton-gpu.pth"
    PYTHONPATH="$SITE:$dir" timeout 290 "$PY" -m bench.layers --random-model /tmp/model_llama --device cuda \
        --core-process on --name "ab_${build}_${ROUND:-1}" --out "$OUT" --concurrency "$@" --requests 32 \
        --max-tokens 64 --max-batch-size 256 --layers engine triton --triton-instances 2 --proxy-workers 4 \
        --perf-analyzer /tmp/perf_analyzer/perf_analyzer/bin/perf_analyzer \
        --aiperf "env LLGTRITON_PLAIN_PYTHON=1 PYTHONPATH=$AIPERF_SITE $PY -m aiperf" > "$OUT/log_${build}_${ROUND:-1}.txt" 2>&1
    echo "$build: exit $?"
    cd "$ROOT"
done
