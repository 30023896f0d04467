# `make run` and `make test` work on a fresh machine: they build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

CHROMIUM := /usr/bin/chromium

.PHONY: run test check fmt schema clean node-present

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gateway serve --host $(HOST) --port $(PORT) --no-auth

# The web demo's tests drive Debian's Chromium (never a downloaded browser); the browser
# SDK's tests run on Node. Both come from the system's packages when missing.
$(CHROMIUM):
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

node-present:
	command -v node >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs)

test: $(STAMP) $(CHROMIUM) node-present check
	node --test client_sdk/js
	$(BIN)/python -m pytest

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

schema: $(STAMP)
	$(BIN)/gateway schema --output client_sdk/js/protocol.schema.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
