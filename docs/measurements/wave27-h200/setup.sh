# sourced by smoke.sh and full.sh: the image's python3 with the carried wheels, the repo on the path, no hub
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=/tmp/site:$PWD
PY=${PY:-python3} DEV=${DEV:-cuda} LIKE=${LIKE:-.like} SI=${SI:-/tmp/si}
if [ -z "${SKIP_PIP:-}" ] && [ ! -f /tmp/site/.done ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/errs.txt" 2>&1 || { tail -20 "$OUT/errs.txt"; exit 3; }
  touch /tmp/site/.done
fi
for m in draft target; do [ -f "$LIKE/tokenizer.json" ] && cp -n "$LIKE/tokenizer.json" "$LIKE/$m/"; done
true
