#!/usr/bin/env bash
# bench.step_breakdown (the engine alone, random Llama-3.2-1B-shaped weights, the Llama 3.2 tokenizer)
# for two builds in one lease: this tree ("new") and a copy with device_carry/overlay laid over it
# ("old"), alternating build by build, each build in a process of its own per round.
#   mkdir -p device_carry/overlay/backend && git show REV:backend/x.py > device_carry/overlay/backend/x.py  # here
#   OUT=$OUT ROUNDS=2 bash bench/gpu_step_ab.sh    # there: carry device_carry/{wheels,model_llama,jsonschemabench,
#       pycuda_site,overlay}; results in $OUT/step_ab_<build>_<round>.json
set -u
OUT=${OUT:-docs/results}
ROUNDS=${ROUNDS:-2}
KINDS=${KINDS:-free shared own tools}
LAUNCH=${LAUNCH:-on}
CLIENTS=${CLIENTS:-64 256}
mkdir -p "$OUT" /tmp/llgtriton-site
ROOT=$PWD
if [ -f device_carry/pycuda_site/pycuda_site.tgz ]; then
    tar xzf device_carry/pycuda_site/pycuda_site.tgz -C /tmp/llgtriton-site
fi
source bench/gpu_setup.sh > "$OUT/setup.txt" 2>&1
if [ ! -f /tmp/model_llama/tokenizer.json ]; then
    rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -df /tmp/model_llama/tokenizer.json.xz
fi
rm -rf /tmp/old && mkdir /tmp/old && cp -r $(ls -A | grep -v -e '^device_carry$' -e '^.git$') /tmp/old/
ln -s "$ROOT/device_carry" /tmp/old/device_carry && cp -r device_carry/overlay/. /tmp/old/
for round in $(seq 1 "$ROUNDS"); do
    order="old new" && [ $((round % 2)) = 0 ] && order="new old"
    for build in $order; do
        dir=$ROOT && [ "$build" = old ] && dir=/tmp/old
        cd "$dir"
        PYTHONPATH="$SITE:$dir" "$PY" -m bench.step_breakdown --device cuda --random-model /tmp/model_llama \
            --shape llama-3.2-1b --data device_carry/jsonschemabench --clients $CLIENTS --rounds 1 --kinds $KINDS --launch-ahead $LAUNCH \
            --out "$OUT" --name "step_ab_${build}_${round}" > "$OUT/log_${build}_${round}.txt" 2>&1
        echo "$build round $round: exit $?"
        cd "$ROOT"
    done
done
