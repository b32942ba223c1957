#!/usr/bin/env bash
# The step loop at long contexts on the GPU machine (issue 38): time between tokens and the step's
# post-processing time, constrained vs free, for this tree and older ones side by side in one run.
# Each older tree is its backend/ and llgtriton/ (the benchmark itself is this tree's):
#   git archive <commit> backend llgtriton | tar -x -C device_carry/<name>   # here, per older tree
#   bash bench/gpu_step_time.sh device_carry/<name> ...                        # there
set -euo pipefail
OUT=${OUT:-docs/results}
mkdir -p "$OUT"
source bench/gpu_setup.sh
ARGS=(--device cuda --random-model device_carry/model --shape llama-3.2-1b --data device_carry/jsonschemabench
    --context-tokens "${CONTEXT_TOKENS:-3072}" --batches 1 32 128 --rounds 2 --max-tokens 48 --out "$OUT")
for tree in "$PWD" "$@"; do
    name=step_time_$(basename "$tree" | tr -c 'a-zA-Z0-9_\n' _)
    [ "$tree" = "$PWD" ] && name=step_time_this_tree
    # The older tree's packages first on the path (-P: not the working folder before it).
    PYTHONPATH="$SITE:$tree:$PWD" "$PY" -P -m bench.tbt_overhead "${ARGS[@]}" --name "$name"
done
