#!/bin/bash
# usage: up.sh NAME BASEPORT TRIM_EVERY_S (0: log mallinfo2 only)
# tiny-pair stack, code from /work/main (editable install in its venv), XDG dirs under /tmp/w58/rss/xdg/NAME,
# ports BASE..BASE+4 (coord, target, draft, memory, http), metrics BASE+5..BASE+8.
# PYTHONPATH=/tmp/w58/rss/site: its sitecustomize.py acts only in the `python -m coordinator` process.
N=$1; B=$2; TRIM=${3:-0}
X=/tmp/w58/rss/xdg/$N; O=/tmp/w58/rss/out/$N
mkdir -p $X/{data,state,cache,run} $O/cmd; chmod 700 $X/run
cd /tmp/w58/rss
export PYTHONPATH=/tmp/w58/rss/site XDG_DATA_HOME=$X/data XDG_STATE_HOME=$X/state XDG_CACHE_HOME=$X/cache XDG_RUNTIME_DIR=$X/run
export W58_MALLOC_OUT=$O W58_TRIM_EVERY=$TRIM W58_LOG_EVERY=60
T=/work/main/.cache/tiny-a2e4fbb4c962
nohup /work/main/.venv/bin/calispec up --draft $T/draft --target $T/target --port $B --target-port $((B+1)) --draft-port $((B+2)) \
  --memory-port $((B+3)) --http-port $((B+4)) --metrics-port $((B+5)) --log-dir $O/logs \
  > $O/up.out 2>&1 &
echo $! > $O/up.pid
