set -u; source .like/setup.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -V; grep -m1 'model name' /proc/cpuinfo; nproc; } > "$OUT/env.txt" 2>&1
$PY -c "import torch, transformers, grpc, google.protobuf as pb, sqlite_utils, fastapi, uvicorn, cryptography, openai, prometheus_fastapi_instrumentator, huggingface_hub as h; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'hub', h.__version__, 'grpc', grpc.__version__, 'protobuf', pb.__version__)" >> "$OUT/env.txt" 2>&1
rc=$?; cat "$OUT/env.txt"; [ $rc = 0 ] || exit 4
timeout 150 $PY -m pytest tests/e2e/test_stack.py --device $DEV -x -q -p no:cacheprovider -k "name_their_dtype or greedy_sd_equals_ar_token" 2>&1 | tee "$OUT/smoke.txt" | tail -30
