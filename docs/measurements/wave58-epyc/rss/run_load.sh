#!/bin/bash
# usage: run_load.sh NAME BASEPORT DURATION_S SAMPLES : sampler (30 s) + wave 56's HTTP mix at concurrency 3, seed 57
N=$1; B=$2; D=$3; C=$4; O=/tmp/w58/rss/out/$N
cd /tmp/w58/rss
export CALISPEC_TOKEN=$(grep -o 'CALISPEC_TOKEN=\S*' $O/up.out | cut -d= -f2)
nohup /work/main/.venv/bin/python sampler.py $O $B 30 $C > $O/sampler.out 2>&1 &
echo $! > $O/sampler.pid
nohup /work/main/.venv/bin/python traffic.py --grpc 127.0.0.1:$B --http http://127.0.0.1:$((B+4)) --concurrency 3 --duration $D \
  --seed 57 --only http_completion,http_chat,http_disconnect,http_unary_disconnect,http_invalid \
  --rows $O/requests.csv --log $O/traffic.log > $O/traffic.out 2>&1 &
echo $! > $O/traffic.pid
