#!/bin/bash
# usage: [DTYPE=float32] [IMPORT=FILE] [UP_FLAGS="--default-lambda 4"] eval_served.sh LABEL MODES -- calispec up on a
# fresh memory (seeded with the shipped file, or IMPORT instead; UP_FLAGS: more flags of calispec up, split on
# spaces, since wave 49), calispec eval over the eval tasks, memory stats, calispec down; output in
# ${OUT:-/tmp}/ev-LABEL (wave 41 ran it from /tmp/w41 with the repo at /work/main)
set -u
cd "$(dirname "$0")/../../.."
L=$1; MODES=$2; W=${OUT:-/tmp}/ev-$L
rm -rf $W; mkdir -p $W
T=$HOME/.cache/calispec/models/qwen-coder/target
date > $W/times.txt
.venv/bin/calispec up --memory-db $W/memory.db --open --port 52050 --target-port 52051 --draft-port 52052 \
  --memory-port 52053 --no-http --log-dir $W/logs ${DTYPE:+--dtype $DTYPE} ${IMPORT:+--no-calibration} ${UP_FLAGS:-} > $W/up.txt 2>&1 &
until grep -q '^ready:' $W/up.txt; do
  if ! kill -0 $! 2>/dev/null; then echo "up failed"; cat $W/up.txt; exit 1; fi
  sleep 2
done
NS=$(sed -n 's/^memory namespace: //p' $W/up.txt)
if [ -n "${IMPORT:-}" ]; then  # another calibration file instead of the shipped one
  .venv/bin/calispec memory import --memory-addr 127.0.0.1:52053 --namespace "$NS" --file "$IMPORT" > $W/import.txt 2>&1
fi
date >> $W/times.txt
.venv/bin/calispec eval --address 127.0.0.1:52050 --memory-address 127.0.0.1:52053 --memory-namespace "$NS" \
  --tokenizer $T --task-set eval --modes $MODES --gamma 6 --max-new-tokens 128 --no-plots --out $W/eval \
  > $W/eval.txt 2>&1
echo "eval rc $?" >> $W/times.txt
.venv/bin/calispec memory stats --memory-addr 127.0.0.1:52053 --namespace "$NS" > $W/memory-stats.txt 2>&1 || true
.venv/bin/calispec down >> $W/times.txt 2>&1
wait
date >> $W/times.txt
