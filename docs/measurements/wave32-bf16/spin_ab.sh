#!/bin/bash
# Scratch (wave 32, 2026-12-05, on fa580e2): a DEBUG `calispec up` on port 52050 with its log dir at /tmp/w32/s; output in spin-ab.txt.
# A/B: SCHED_IDLE spinners keeping the 2 vCPUs from halting between rounds.
LOG=/tmp/w32/s/logs/coordinator.log
for phase in A B A B; do
  if [ $phase = B ]; then
    for i in 1 2; do chrt --idle 0 python3 -c 'while True: pass' & done
  fi
  start=$(wc -l < $LOG)
  echo "== phase $phase"
  PYTHONPATH=. .venv/bin/python docs/measurements/wave31-bf16/c1_driver.py 127.0.0.1:52050 csd,ar 4
  tail -n +$((start+1)) $LOG > /tmp/w32/s/log-$phase-$start.txt
  .venv/bin/python docs/measurements/wave31-bf16/c1_breakdown.py /tmp/w32/s/log-$phase-$start.txt | grep -E 'rounds|overhead|handler - fwd|call - handler|rest'
  pkill -f 'while True: pass'
done
