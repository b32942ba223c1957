#!/usr/bin/env bash
# Issue 51 on the GPU machine: bench.step_breakdown (the engine alone, random Llama-3.2-1B-shaped weights,
# the Llama 3.2 tokenizer, launched ahead) with the matchers on the engine's own threads and in a mask
# process of their own (--mask-process off / on), each variant in a process of its own per round,
# alternating. VARIANTS="old new" compares two builds instead, both with the mask process: this tree
# ("new") and a copy with the files of device_carry/overlay laid over it ("old"), each with
# MASK_PROCESSES children (default 1). VARIANTS="p1 p2 p4" runs this tree with the mask process on and
# that many children (--mask-processes).
#   make device-carry device-carry-llama                   # here
#   OUT=$OUT ROUNDS=2 bash bench/gpu_mask_process.sh       # there: carry device_carry/{wheels,model_llama,
#       jsonschemabench,pycuda_site[,overlay]}; results in $OUT/mask_process_<variant>_<round>.json
#   ROUND=2 runs only round 2 (its order: the variants reversed)
set -u
OUT=${OUT:-docs/results}
ROUNDS=${ROUNDS:-2}
KINDS=${KINDS:-free shared own}
CLIENTS=${CLIENTS:-64 256}
mkdir -p "$OUT" /tmp/llgtriton-site && OUT=$(cd "$OUT" && pwd)
if [ -f device_carry/pycuda_site/pycuda_site.tgz ]; then
    tar xzf device_carry/pycuda_site/pycuda_site.tgz -C /tmp/llgtriton-site
fi
source bench/gpu_setup.sh > "$OUT/setup.txt" 2>&1
if [ ! -f /tmp/model_llama/tokenizer.json ]; then
    rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -df /tmp/model_llama/tokenizer.json.xz
fi
VARIANTS=${VARIANTS:-off on}
ROOT=$PWD
source bench/gpu_carried.sh
[[ " $VARIANTS " == *" old "* ]] && old_build
for round in ${ROUND:-$(seq 1 "$ROUNDS")}; do
    order=$VARIANTS && [ $((round % 2)) = 0 ] && order=$(echo "$VARIANTS" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for variant in $order; do
        dir=$ROOT && [ "$variant" = old ] && dir=/tmp/old
        children=${MASK_PROCESSES:-1}
        case $variant in old | new) mode=on ;; p*) mode=on children=${variant#p} ;; *) mode=$variant ;; esac
        cd "$dir"
        PYTHONPATH="$SITE:$dir" "$PY" -m bench.step_breakdown --device cuda --random-model /tmp/model_llama \
            --shape llama-3.2-1b --data device_carry/jsonschemabench --clients $CLIENTS --rounds 1 --kinds $KINDS \
            --mask-process "$mode" $([ "$children" = 1 ] || echo --mask-processes "$children") --out "$OUT" --name "mask_process_${variant}_${round}" \
            > "$OUT/log_${variant}_${round}.txt" 2>&1
        echo "mask process $variant, round $round: exit $?"
        cd "$ROOT"
    done
done
"$PY" - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("log_*_*.txt")):
    for line in path.read_text().splitlines():
        if " clients, " in line and ": {" in line:
            head, cell = line.split(": {", 1)
            cell = json.loads("{" + cell)
            parts = cell.get("parts_ms_per_step", {})
            wait = {k: round(v, 2) for k, v in parts.items() if "wait" in k or "fill" in k or "compute" in k}
            print(path.stem, head.split("INFO")[-1].strip(), round(cell["tokens_per_s"]), cell["tbt_ms"]["p50"], wait)
PY
