# Calispec: `make run` sets everything up and serves a demo request; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.calispec-installed
# empty PROMPT: the pair's built-in coding prompt (chat-formatted for the Qwen coder pair)
PROMPT ?=
PAIR   ?= qwen-coder
MODE   ?= csd
DTYPE  ?= auto

.PHONY: install run test test-slow lint format proto calibration bench-verifier bench-forward bench-memory bench-pair bench-compare bench-calibration bench-cuda test-cuda cuda bench-stand-in clean

# torch is pinned here and installed first (the CPU wheel these machines carry); an unpinned torch
# pulls a CUDA build. The base install is the light client; `serve` brings what the services need.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[serve,dev,bench,deploy,otel]"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/calispec demo --pair $(PAIR) $(if $(PROMPT),--prompt "$(PROMPT)") --mode $(MODE) --max-new-tokens 160

test: install
	$(BIN)/python -m pytest

# slow tests: the real model pair (pulled if needed) and a Ray cluster in a network namespace
test-slow: install
	$(BIN)/pip install --quiet -e ".[ray]"
	$(BIN)/python -m pytest -m slow

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/calispec/v1/*.proto

# The qwen-coder pair's shipped calibration: teacher-forced over the repo's own corpus (never the eval
# tasks), then checked against the sha256 recorded in the repo (docs/calibration.md).
CALIBRATION_DIR := calispec_tools/data/calibration
calibration: install
	$(BIN)/calispec calibrate --corpus $(CALIBRATION_DIR)/corpus --generate --max-new-tokens 96 --batch-size 32 --pair qwen-coder --dtype float32 \
		--int8-scales call --min-count 2 --export $(CALIBRATION_DIR)/qwen-coder.json
	cd $(CALIBRATION_DIR) && sha256sum -c SHA256SUMS

bench-verifier: install
	$(BIN)/python -m calispec_tools.bench.verifier

bench-pair: install
	$(BIN)/python -m calispec_tools.bench.pair --pair $(PAIR) --dtype $(DTYPE)

# ISA=avx2: every kernel library capped at AVX2, this CPU's kernels become an AVX2-only CPU's
# (docs/performance.md, "Emulating a CPU without bf16 units"); auto dtype then resolves to float32
AVX2_CAPS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ISA_ENV = $(if $(filter avx2,$(ISA)),$(AVX2_CAPS))

bench-forward: install
	$(ISA_ENV) $(BIN)/python -m calispec_tools.bench.forward --pair $(PAIR) --dtype $(DTYPE)

# the stack against HF assisted generation (docs/performance.md); QUICK=1 for a short run
bench-compare: install
	$(ISA_ENV) $(BIN)/calispec bench compare --pair $(PAIR) --dtype $(DTYPE) $(if $(QUICK),--prompts 2 --max-new-tokens 32 --concurrency 1)

# events/s of teacher-forced calibration against calibrating by SD through the stack (docs/calibration.md)
bench-calibration: install
	$(BIN)/calispec bench calibration --pair $(PAIR)

# the same on a GPU (bf16 on CUDA)
bench-cuda: install
	$(BIN)/calispec bench compare --pair $(PAIR) --device cuda --dtype bfloat16

# On a GPU: the end-to-end stack tests with the model services on CUDA (float32, where greedy SD must equal AR
# token for token), then bench-cuda. They fail, never skip, where torch sees no CUDA device.
test-cuda: install
	$(BIN)/python -m pytest tests/e2e/test_stack.py --device cuda

cuda: test-cuda bench-cuda

# Where the pair's weights cannot go (a lent GPU: 64 MiB per call, no network): stand-ins with its architectures,
# the greedy draft agreeing with the target on AGREEMENT of tokens (calispec_tools/bench/stand_in.py); their
# forward cost curves, then bench compare on them. LIKE holds draft/ and target/ with config and tokenizer.
LIKE      ?= $(HOME)/.cache/calispec/models/$(PAIR)
AGREEMENT ?= 0.85
STAND_IN  ?= .cache/stand-in
DEVICE    ?= cuda
bench-stand-in: install
	$(BIN)/python -m calispec_tools.bench.stand_in --draft $(LIKE)/draft --target $(LIKE)/target --agreement $(AGREEMENT) --out $(STAND_IN)
	for m in target draft; do $(BIN)/python -m calispec_tools.bench.forward --model $(STAND_IN)/$$m --device $(DEVICE) --dtype bfloat16 --reps 5 || exit 1; done
	$(BIN)/calispec bench compare --draft $(STAND_IN)/draft --target $(STAND_IN)/target --device $(DEVICE) --dtype bfloat16 \
		--prompts 4 --max-new-tokens 96 --concurrency 1,4,8 --load-requests 0

bench-memory: install
	$(BIN)/python -m calispec_tools.bench.memory

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
