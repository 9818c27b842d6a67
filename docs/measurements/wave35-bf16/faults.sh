#!/bin/sh
# Scratch (wave 35): page faults and kernel time of the model services over concurrency-8 levels through a running
# `calispec up` (services on 50051 / 50052, coordinator on $1): `sh faults.sh 127.0.0.1:52050 A:csd,A:ar`.
# /proc/PID/stat: field 10 minor faults, 14 user and 15 kernel time in clock ticks (1/100 s here).
target=$(pgrep -f "target_service .*--port 50051" | head -1)
draft=$(pgrep -f "draft_service .*--port 50052" | head -1)
show() { printf '%s %s: minflt %s utime %s stime %s\n' "$1" "$2" $(awk '{print $10, $14, $15}' "/proc/$3/stat"); }
show before target "$target"; show before draft "$draft"
REQS=16 PYTHONPATH=. .venv/bin/python docs/measurements/wave29-bf16/ab_driver.py "$1" "$1" "$2"
show after target "$target"; show after draft "$draft"
