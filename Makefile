# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test chaos demo lint typecheck bench clean engine test-engine agents test-agents

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

# The side-by-side suite (docs/BENCHMARKS.md): slotgate against LiteLLM, nginx and no proxy,
# ~7-8 minutes; installs nginx and wrk with apt-get when missing, LiteLLM into its own venv.
.PHONY: bench-quick bench-overhead
# BEFORE=REV adds slotgate at that revision as one more target: `make bench BEFORE=6f40d4f`
# shows the hot path's targets before (#31's start) and after, from one run.
BEFORE ?=
bench: $(STAMP)
	$(BIN)/python bench/suite.py --apt $(if $(BEFORE),--before $(BEFORE))

bench-quick: $(STAMP)   # one short round, nothing rewritten
	$(BIN)/python bench/suite.py --apt --quick --no-doc

bench-overhead: $(STAMP)   # the older gateway-vs-direct bench alone
	$(BIN)/python bench/overhead.py

# #32's targets: interactive traffic with and without a batch on config.yaml's 70B, ~3
# minutes; BATCH_ARGS=--quick for ~40 s, --auth to run the gateways with an API key. The
# gateways run in the bench's process: PYTHONPATH makes them this tree's.
.PHONY: bench-batch
BATCH_ARGS ?=
bench-batch: $(STAMP)
	PYTHONPATH=. $(BIN)/python bench/batch_share.py $(BATCH_ARGS)

# #33's target: interactive traffic at 0.8x of config.yaml's 70B with shadow comparisons on
# (shadow_rate 1.0) and off, ~3 minutes; SHADOW_ARGS=--quick for ~40 s, --pairs N, --seed N.
.PHONY: bench-shadows
SHADOW_ARGS ?=
bench-shadows: $(STAMP)
	PYTHONPATH=. $(BIN)/python bench/shadow_share.py $(SHADOW_ARGS)

# #34's target: a load step 0.3x -> 2x -> 0.3x of one simulated replica's capacity, an
# autoscaler in the bench following the gateway's desired replica count (5 s start-up per
# replica, reloads); ~2.5 minutes, rewrites docs/autoscaling-load-step.{png,csv};
# FLEET_ARGS=--quick for ~50 s, --seed N, --png/--csv PATH to write elsewhere.
.PHONY: bench-fleet
FLEET_ARGS ?=
bench-fleet: $(STAMP)
	PYTHONPATH=. $(BIN)/python bench/load_step.py $(FLEET_ARGS)

# A real engine for tests/engine: llama.cpp's server and a small GGUF model, in a venv of
# their own so that `make test` never needs them. The model and the built wheel are kept
# in SLOTGATE_ENGINE_CACHE across runs and checkouts.
ENGINE_VENV  := .venv-engine
ENGINE_BIN   := $(ENGINE_VENV)/bin
ENGINE_STAMP := $(ENGINE_VENV)/.installed
SLOTGATE_ENGINE_CACHE ?= $(HOME)/.cache/slotgate/engine
export SLOTGATE_ENGINE_CACHE
LLAMA_CPP := llama-cpp-python==0.3.36
# llama.cpp's default native build crashes on these CPUs: a portable AVX2 build instead.
ENGINE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
	-DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF
# pip's wheel cache ignores CMAKE_ARGS, so the wheel is kept per version and build flags.
ENGINE_WHEELS = $(SLOTGATE_ENGINE_CACHE)/wheels-$(shell printf '%s %s' '$(LLAMA_CPP)' \
	'$(ENGINE_CMAKE_ARGS)' | sha256sum | cut -c1-12)

$(ENGINE_STAMP): tests/engine/requirements.txt
	rm -rf $(ENGINE_VENV)
	$(PYTHON) -m venv $(ENGINE_VENV)
	echo '*' > $(ENGINE_VENV)/.gitignore
	$(ENGINE_BIN)/pip install --quiet --upgrade pip
	ls $(ENGINE_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(ENGINE_BIN)/pip wheel --quiet --no-cache-dir \
		--no-deps --wheel-dir $(ENGINE_WHEELS) '$(LLAMA_CPP)'
	$(ENGINE_BIN)/pip install --quiet --find-links $(ENGINE_WHEELS) \
		--only-binary llama-cpp-python -r tests/engine/requirements.txt
	$(ENGINE_BIN)/python tests/engine/model.py
	touch $@

engine: $(ENGINE_STAMP)

test-engine: $(ENGINE_STAMP) $(STAMP)
	$(ENGINE_BIN)/python tests/engine/model.py >/dev/null  # again, if the cache was emptied
	SLOTGATE_ENGINE=1 $(BIN)/pytest -q tests/engine

# The real coding agents (Claude Code, Codex) for tests/agents: installed from npm at the
# versions pinned in tests/agents/package-lock.json, or with SLOTGATE_AGENTS_LATEST=1 at
# the newest, into SLOTGATE_AGENTS_CACHE (kept across runs and checkouts, never the repo).
SLOTGATE_AGENTS_CACHE ?= $(HOME)/.cache/slotgate/agents
export SLOTGATE_AGENTS_CACHE
AGENTS_LOCK := tests/agents/package-lock.json
AGENTS_PINNED = $(SLOTGATE_AGENTS_CACHE)/pinned-$(shell sha256sum $(AGENTS_LOCK) | cut -c1-12)
AGENTS_DIR = $(if $(filter 1,$(SLOTGATE_AGENTS_LATEST)),$(SLOTGATE_AGENTS_CACHE)/latest,$(AGENTS_PINNED))

agents:
	@command -v npm >/dev/null || { echo "npm is not installed (apt-get install nodejs npm)"; exit 1; }
	mkdir -p $(AGENTS_DIR)
ifeq ($(SLOTGATE_AGENTS_LATEST),1)
	npm install --prefix $(AGENTS_DIR) --no-audit --no-fund \
		@anthropic-ai/claude-code@latest @openai/codex@latest
else
	test -x $(AGENTS_DIR)/node_modules/.bin/claude -a -x $(AGENTS_DIR)/node_modules/.bin/codex || \
		{ cp tests/agents/package.json $(AGENTS_LOCK) $(AGENTS_DIR)/ && \
		  npm ci --prefix $(AGENTS_DIR) --no-audit --no-fund; }
endif
	$(AGENTS_DIR)/node_modules/.bin/claude --version
	$(AGENTS_DIR)/node_modules/.bin/codex --version

test-agents: agents $(STAMP)
	SLOTGATE_AGENTS=1 SLOTGATE_AGENTS_BIN=$(AGENTS_DIR)/node_modules/.bin $(BIN)/pytest -q tests/agents

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache
