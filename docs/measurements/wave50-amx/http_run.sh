#!/bin/bash
# $1: label, $2: source dir (PYTHONPATH), $3: ports base
set -u
label=$1; src=$2; base=$3
d=/tmp/w50/http-$label; rm -rf $d; mkdir -p $d
cd $src
XDG_DATA_HOME=$d/data PYTHONPATH=$src nohup /work/main/.venv/bin/python -m calispec_tools.cli up --pair tiny --port ${base}0 --target-port ${base}1 --draft-port ${base}2 --memory-port ${base}3 --http-port ${base}8 --log-dir $d/logs > $d/up.out 2>&1 &
for i in $(seq 1 180); do curl -s -o /dev/null http://127.0.0.1:${base}8/health && break; sleep 1; done
grep -o "CALISPEC_TOKEN=[^ ]*" $d/up.out | head -1 | cut -d= -f2 > $d/key
P=/work/main/.venv/bin/python; S=/work/main/docs/measurements/wave50-amx/http_choices.py; U=http://127.0.0.1:${base}8
echo "# $label: $(git -C $src log --oneline -1)"
$P $S $U $d/key 16,16,8 60 "$label"
$P $S $U $d/key 16,16,9 60 "$label"
$P $S $U $d/key 16,16,16 60 "$label"
$P $S $U $d/key 16,16,16 200 "$label"
XDG_DATA_HOME=$d/data PYTHONPATH=$src /work/main/.venv/bin/python -m calispec_tools.cli down > /dev/null 2>&1
