#!/usr/bin/env bash
# Issue 36's experiments on the async alpha=2 run, in this tree: paired rounds in alternating order,
# "before" as the code runs, "after" with one of async_timeline.py's probe switches set, e.g.
#   ASYNC_BENCH_PUSH_DELAY_S=0.3     every weight push of the trainer held back 0.3 s
#   ASYNC_BENCH_INLINE_SCORING=1     answers scored with the engine waiting (as d5543f8 did)
# Then: python benchmarks/async_timeline.py OUT
# Usage: bash benchmarks/probe_ab.sh NAME=VALUE [ROUNDS=6] [OUT=/tmp/probe_ab]
set -euo pipefail
cd "$(dirname "$0")/.."
SWITCH=${1:?a probe switch, NAME=VALUE}; ROUNDS=${2:-6}; OUT=${3:-/tmp/probe_ab}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    dir=$OUT/${r}_$side; rm -rf "$dir"
    if [ "$side" = after ]; then set -- env "$SWITCH"; else set -- env; fi
    "$@" python benchmarks/async_throughput.py --steps 8 --warmup 2 --no-generation-table \
      --only "async alpha=2" --runs-dir "$dir" --group-timeline > "$dir.log" 2>&1
    echo "round $r $side: $(grep '"variant"' "$dir.log" | python -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_s"])')"
  done
done
