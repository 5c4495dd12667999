# The two commands of the README:
#   make run   - install into .venv, migrate, start broker + web + lab controller
#   make test  - install into .venv with test extras (and Debian's chromium if root), run the suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test install install-test chromium node-peers cpp-peer bench clean

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

# Spark's JVM classes as a class-data-sharing archive of this environment
# (dashboard/lag/class_archive.py: ~2 s off each Spark JVM's start). Made after the packages
# (PySpark's jars are its class path); without it Spark still runs, so a failure only warns.
SPARK_CLASSES := $(VENV)/share/rebalance-lab/spark-classes.jsa
$(SPARK_CLASSES): $(VENV)/.installed
	$(BIN)/python -m dashboard.lag.class_archive || echo "Spark's class archive not built: Spark starts without it" >&2

install: $(VENV)/.installed $(SPARK_CLASSES)
install-test: $(VENV)/.installed-test $(SPARK_CLASSES)

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

# Other people's RocketMQ clients (ali-ons, Node.js) from the npm registry into the repo's
# own ignored node_modules; Debian's nodejs/npm are installed first if missing (as root).
node_modules/.installed: package.json
	@if ! command -v npm >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's nodejs and npm"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  else \
	    echo "npm is missing and we are not root: remoting peer tests will fail (apt-get install nodejs npm)" >&2; \
	  fi; \
	fi
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

node-peers: node_modules/.installed

# rocketmq-client-cpp 2.1: a third party's PyPI bundle of the native library (opt-in for
# `make run`, installed by `make test`). Kept apart from the venv's site-packages: its
# module is called "rocketmq", as the official v5 client's is; peers/cpp_peer.py runs
# with PYTHONPATH pointing here.
CPP_PEER := $(VENV)/peers/cpp/.installed
$(CPP_PEER): | $(BIN)/python
	$(BIN)/pip install --quiet --target $(VENV)/peers/cpp rocketmq-python-cvs==2.1.0.3
	@touch $@

cpp-peer: $(CPP_PEER)

run: install node-peers
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py runlab --host $(HOST) --port $(PORT)

# One pytest run in lanes, in this order (tests/conftest.py): unit, broker, lab, spark, browser;
# a failure in any lane fails it. PYTEST_ARGS narrows it, e.g. PYTEST_ARGS="-m unit".
# PYTEST_WORKERS test processes (pytest-xdist) take whole modules in that order, the spark
# lane first and as two units (tests/conftest.py's scheduler): most tests wait on brokers,
# timers and child processes, so three share the two cores well (0: one process). The 15
# slowest tests are listed at the end.
PYTEST_WORKERS ?= 3
test: install-test chromium node-peers cpp-peer
	$(BIN)/python manage.py check
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --durations=15 $(PYTEST_ARGS)

bench: install-test
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var test-output node_modules
