# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test chaos demo lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/slotgate serve

demo: $(STAMP)
	$(BIN)/slotgate demo

test: $(STAMP)
	$(BIN)/pytest -q

chaos: $(STAMP)   # tests/chaos at full size (make test runs them small)
	SLOTGATE_CHAOS_SCALE=10 $(BIN)/pytest -q tests/chaos

lint: $(STAMP)
	$(BIN)/ruff check router policies classifier tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache
