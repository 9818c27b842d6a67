#!/bin/bash
# end of run: malloc_info + smaps + mp_ (gdb read-only print) under load, then timed malloc_trim(0)s
cd /tmp/w58/rss
PY=/work/main/.venv/bin/python
for N in A B; do
  P=$(tail -1 out/$N/series.csv | cut -d, -f3); echo $P > out/$N/coord.pid
  touch out/$N/cmd/info-end; $PY smaps_classify.py $P end out/$N/smaps.csv > /dev/null
  timeout 60 gdb -p $P -batch -nx -ex 'p mp_' 2>&1 | grep '^\$1' > out/$N/mp_end.txt
done
sleep 5
for i in 1 2 3; do for N in A B; do touch out/$N/cmd/trim-underload$i; done; sleep 4; done
for N in A B; do touch out/$N/cmd/info-aftertrim; P=$(cat out/$N/coord.pid); $PY smaps_classify.py $P aftertrim out/$N/smaps.csv > /dev/null; done
# wait for both traffic generators to end
while kill -0 $(cat out/A/traffic.pid) 2>/dev/null || kill -0 $(cat out/B/traffic.pid) 2>/dev/null; do sleep 5; done
date -u; sleep 10
for i in 1 2 3 4 5; do for N in A B; do touch out/$N/cmd/trim-idle$i; done; sleep 3; done
for N in A B; do touch out/$N/cmd/info-idle; P=$(cat out/$N/coord.pid); $PY smaps_classify.py $P idle out/$N/smaps.csv > /dev/null; done
sleep 4; echo done
