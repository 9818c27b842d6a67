#!/bin/bash
# run.sh: every candidate on every kernel set, one at a time
cd /tmp/w47/demo
B='Write a Python function `is_prime(n: int) -> bool` that returns whether n is a prime number, and a function `primes_below(n: int) -> list[int]` that uses it. Reply with only the code in one ```python block.'
C='Write a Python function `is_prime(n: int) -> bool` that returns whether n is a prime number, with a docstring and three doctest examples. Reply with only the code in one ```python block.'
D='Write a Python function `is_prime(n: int) -> bool` that returns whether n is a prime number, and test it on the numbers 1 to 20. Reply with only the code in one ```python block.'
CAPS="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
for name in B C D; do
  msg="${!name}"
  for kernels in bf16 float32 avx2-float32; do
    out="$name-$kernels"; rm -rf "$out"; mkdir -p "$out"
    case $kernels in
      bf16) env=""; dt="" ;;
      float32) env=""; dt="--dtype float32" ;;
      avx2-float32) env="$CAPS"; dt="--dtype float32" ;;
    esac
    date > "$out/out.txt"
    env $env /work/main/.venv/bin/python candidate.py "$msg" --pair qwen-coder --mode csd --max-new-tokens 160 $dt \
      --memory-db "$PWD/$out/memory.db" --log-dir "$PWD/$out/logs" >> "$out/out.txt" 2> "$out/err.txt"
    echo "rc $?" >> "$out/out.txt"; date >> "$out/out.txt"
    echo "$out: $(grep '\[eos\]\|tokens in' "$out/out.txt" | tail -1)"
  done
done
