#!/bin/bash
# $1: label, $2: ports base (5 ports from ${base}0), the rest: flags of `calispec up` (e.g. --dtype float32)
set -u
label=$1; base=$2; shift 2
d=/tmp/w51/seeded-$label; rm -rf $d; mkdir -p $d
XDG_DATA_HOME=$d/data nohup /work/main/.venv/bin/calispec up --pair tiny "$@" --port ${base}0 --target-port ${base}1 --draft-port ${base}2 --memory-port ${base}3 --http-port ${base}4 --log-dir $d/logs > $d/up.out 2>&1 &
for i in $(seq 1 180); do grep -q "CALISPEC_TOKEN=" $d/up.out && break; sleep 1; done
grep -o "CALISPEC_TOKEN=[^ ]*" $d/up.out | head -1 | cut -d= -f2 > $d/key
echo "# $label ($*): $(git -C /work/main log --oneline -1)"
/work/main/.venv/bin/python /work/main/docs/measurements/wave51-amx/seeded_repro.py 127.0.0.1:${base}0 $d/key
XDG_DATA_HOME=$d/data /work/main/.venv/bin/calispec down > /dev/null 2>&1
