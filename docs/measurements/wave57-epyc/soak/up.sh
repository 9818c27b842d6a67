#!/bin/bash
# usage: up.sh NAME BASEPORT [extra env assignments via env]
# starts a tiny-pair stack with XDG dirs under /tmp/w57/soak-xdg/NAME, ports BASE..BASE+4 (coord, target, draft, memory, http), metrics BASE+5..BASE+8
N=$1; B=$2
X=/tmp/w57/soak-xdg/$N
mkdir -p $X/{data,state,cache,run} /tmp/w57/soak-out/$N; chmod 700 $X/run
cd /tmp/w57/soak
export PYTHONPATH=/tmp/w57/soak XDG_DATA_HOME=$X/data XDG_STATE_HOME=$X/state XDG_CACHE_HOME=$X/cache XDG_RUNTIME_DIR=$X/run
T=/work/main/.cache/tiny-a2e4fbb4c962
nohup /work/main/.venv/bin/calispec up --draft $T/draft --target $T/target --port $B --target-port $((B+1)) --draft-port $((B+2)) \
  --memory-port $((B+3)) --http-port $((B+4)) --metrics-port $((B+5)) --log-dir /tmp/w57/soak-out/$N/logs \
  > /tmp/w57/soak-out/$N/up.out 2>&1 &
echo $! > /tmp/w57/soak-out/$N/up.pid
