#!/usr/bin/env bash
# lm-eval (EleutherAI's harness) against Calispec's HTTP API, then lm-eval's own in-process Hugging Face backend on
# the same target weights, on this folder's two small tasks; compare.py sets the two runs side by side.
#
#   LM_EVAL=/path/to/venv-with-lm-eval/bin/lm_eval  URL=http://127.0.0.1:8000  MODEL=<served name>  bash run.sh OUT calispec
#   (stop the stack)  LM_EVAL=...  DTYPE=float32  bash run.sh OUT hf
#
# The first part needs Calispec serving (e.g. `calispec up --open --dtype float32`); the second runs the target in
# lm-eval's own process, so stop the stack first (both at once, in float32, do not fit 23 GiB). lm-eval is not a
# dependency of the project: install it in a venv of its own (`pip install torch==2.13.0 "lm-eval[api,hf]"`). No
# network: the tasks' data are these JSONL files, the tokenizer is the server's (lm-eval finds /tokenizer_info and
# /tokenize and uses them) or, for the second part, the target's directory.
set -euo pipefail
out=$(realpath "${1:?OUT_DIR}")
part=${2:?calispec or hf}
here=$(dirname "$(realpath "$0")")
target=${TARGET:-$HOME/.cache/calispec/models/qwen-coder/target}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$here"
mkdir -p "$out"
if [ "$part" = calispec ]; then
"$LM_EVAL" --model local-completions --tasks calispec_mc,calispec_gen --include_path "$here" \
  --model_args "model=$MODEL,base_url=$URL/v1/completions,num_concurrent=1,max_retries=1,tokenizer_backend=auto" \
  --log_samples --output_path "$out/calispec" 2>&1 | tee "$out/calispec.log"
# the generation task again in lossless `sd` (the server's default is `csd`, lossy by design): a Calispec field
# in the request body, as lm-eval passes gen_kwargs it does not know
"$LM_EVAL" --model local-completions --tasks calispec_gen --include_path "$here" --gen_kwargs mode=sd \
  --model_args "model=$MODEL,base_url=$URL/v1/completions,num_concurrent=1,max_retries=1,tokenizer_backend=auto" \
  --log_samples --output_path "$out/calispec-sd" 2>&1 | tee "$out/calispec-sd.log"
else
"$LM_EVAL" --model hf --tasks calispec_mc,calispec_gen --include_path "$here" \
  --model_args "pretrained=$target,dtype=$DTYPE" --device cpu --batch_size 1 \
  --log_samples --output_path "$out/hf" 2>&1 | tee "$out/hf.log"
fi
