# Calispec: `make run` sets everything up and serves a demo request; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.calispec-installed
PROMPT ?= def fibonacci(n):
MODE   ?= csd

.PHONY: install run test test-slow lint format proto bench-verifier clean

# torch is pinned here (the CPU wheel these machines carry); an unpinned torch pulls a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/calispec demo --prompt "$(PROMPT)" --mode $(MODE) --max-new-tokens 64

test: install
	$(BIN)/python -m pytest

test-slow: install
	$(BIN)/python -m pytest -m slow

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/calispec/v1/*.proto

bench-verifier: install
	$(BIN)/python -m target_service.bench_verifier

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
