set -u; source .like/setup.sh
( timeout 200 $PY -m pytest tests/e2e/test_stack.py --device $DEV -q -p no:cacheprovider > "$OUT/test_cuda.txt" 2>&1; echo "rc=$?" >> "$OUT/test_cuda.txt" ) &
tests=$!
timeout 150 $PY -m calispec_tools.bench.stand_in --draft $LIKE/draft --target $LIKE/target --agreement 0.85 --out $SI >> "$OUT/errs.txt" 2>&1; echo "stand-ins rc=$?"
wait $tests; tail -12 "$OUT/test_cuda.txt"
for m in target draft; do timeout 60 $PY -m calispec_tools.bench.forward --model $SI/$m --device $DEV --dtype bfloat16 --reps 5 2>&1 | grep -v -i "loading\|warn"; done | tee "$OUT/forward.txt"
timeout 60 $PY -m calispec_tools.bench.forward --model $SI/target --device $DEV --dtype bfloat16 --reps 5 --batch 8 --tokens 1,4,7 2>&1 | grep -v -i "loading\|warn" | tee -a "$OUT/forward.txt"
cmp="$PY -m calispec_tools.cli bench compare --device $DEV --dtype bfloat16 --prompts 4 --max-new-tokens 96"
timeout 240 $cmp --draft $SI/draft --target $SI/target --concurrency 1,4,8 --load-requests 0 --json "$OUT/compare.json" > "$OUT/compare.txt" 2>> "$OUT/errs.txt"; echo "compare rc=$?"
cat "$OUT/compare.txt"; grep -v "^  prompt\|Loading\|Warning\|warn" "$OUT/errs.txt" | tail -8
# a draft that never agrees (drafting cannot pay): the target is the same stand-in (same seed, same map)
timeout 60 $PY -c "import sys, torch; from pathlib import Path; from transformers import AutoConfig; from calispec_tools.bench.stand_in import *; t = Path(sys.argv[2]); v = AutoConfig.from_pretrained(t).vocab_size; build_stand_in(Path(sys.argv[1]), Path(sys.argv[3]), next_maps(v, ordinary_ids(t, v), 0.0, 0)[1], 1, torch.bfloat16)" $LIKE/draft $LIKE/target $SI/draft0 > /dev/null 2>&1; echo "draft0 rc=$?"
timeout 150 $cmp --draft $SI/draft0 --target $SI/target --skip-hf --concurrency '' --json "$OUT/compare0.json" > "$OUT/compare0.txt" 2>> "$OUT/errs.txt"; echo "compare0 rc=$?"
cat "$OUT/compare0.txt"
