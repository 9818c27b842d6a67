#!/bin/bash
N=$1; X=/tmp/w58/rss/xdg/$N
cd /tmp/w58/rss
XDG_DATA_HOME=$X/data XDG_STATE_HOME=$X/state XDG_CACHE_HOME=$X/cache XDG_RUNTIME_DIR=$X/run /work/main/.venv/bin/calispec down
