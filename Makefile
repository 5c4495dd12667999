# The two commands of the README:
#   make run   - install into .venv, migrate, start broker + web + lab controller
#   make test  - install into .venv with test extras (and Debian's chromium if root), run the suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test install install-test chromium bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp files re-run the install only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Browser tests drive Debian's chromium; never a downloaded browser.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing and we are not root: browser tests will fail (apt-get install chromium)" >&2; \
	  fi; \
	fi

run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py runlab --host $(HOST) --port $(PORT)

test: install-test chromium
	$(BIN)/python manage.py check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-test
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var test-output
