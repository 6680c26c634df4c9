# Two commands on a fresh machine (Python 3.11+ and make):
#   make run    serve the admin at http://127.0.0.1:8000/admin/ with a worker and beat
#   make demo   as run, plus demo data and five fake nodes (dashboard at /admin/dashboard/)
#   make test   lint, migration check and the whole test suite
#   make screenshots   refresh docs/screenshots/ from the browser test (needs Chromium)
# Both use DATABASE_URL / REDIS_URL when set, and embedded servers under ./var/ when not.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install lock run demo test screenshots lint format bench fuzz faults replays clean

# Every dependency from the locks, each file checked against its hash (requirements.lock:
# what the image runs; requirements-dev.lock: the same pins plus the embedded servers, honcho
# and the test tools), then the project itself, editable, with nothing more resolved.
$(STAMP): pyproject.toml requirements.lock requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Refresh the locks from pyproject.toml (pip-tools, in a venv of its own under var/): run it
# after changing a dependency, and commit both files. The index is PyPI's, whatever pip.conf
# says, so the hashes are PyPI's files'.
LOCK_VENV := var/lock-venv
PIP_COMPILE := PIP_CONFIG_FILE=/dev/null $(LOCK_VENV)/bin/pip-compile --quiet --strip-extras \
	--generate-hashes --index-url https://pypi.org/simple --no-emit-index-url
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet 'pip-tools>=7.4'
	$(PIP_COMPILE) -o requirements.lock pyproject.toml
	$(PIP_COMPILE) --allow-unsafe --extra embedded --extra run --extra dev -c requirements.lock \
		-o requirements-dev.lock pyproject.toml

run: install
	$(BIN)/python -m config.devservers run

# Demo: seeded groups and projects, five fake nodes, the dashboard at /admin/dashboard/.
demo: install
	$(BIN)/python -m config.devservers demo

test: install lint
	$(BIN)/python -m config.devservers test -- $(PYTEST_ARGS)

# The browser test writes its screenshots to its tmp dir; this copies them to
# docs/screenshots/ (Chromium required: apt-get install chromium).
screenshots: install
	ZOEKT_REFRESH_SCREENSHOTS=1 $(BIN)/python -m config.devservers test -- tests/browser/test_dashboard_browser.py

# Heartbeat benchmark (several minutes); figures go to docs/benchmarks.md.
bench: install
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/heartbeat.py $(BENCH_ARGS)

# Generated requests: hypothesis, 2,500 per endpoint (12,500 in all), and schemathesis from
# the OpenAPI schema, 300 per operation; the counts they print go to docs/reliability.md.
# CI runs 150 per endpoint and 5 per operation.
fuzz: install
	ZOEKT_FUZZ_EXAMPLES=2500 ZOEKT_SCHEMA_EXAMPLES=300 $(BIN)/python -m config.devservers test -- tests/api/test_fuzz.py tests/api/test_schemathesis.py -s -q

# Faults on the whole stack (its own PostgreSQL and Redis): worker SIGKILLs, outages and
# 1,000 nodes of load; about an hour together. Figures go to docs/reliability.md.
faults: install
	$(BIN)/python bench/faults.py kill
	$(BIN)/python bench/faults.py outage --service postgres --seconds 20
	$(BIN)/python bench/faults.py outage --service postgres --seconds 120
	$(BIN)/python bench/faults.py outage --service redis --seconds 20
	$(BIN)/python bench/faults.py outage --service redis --seconds 120
	$(BIN)/python bench/faults.py load

# The replays (about 80 minutes together): tables on stdout, charts in docs/replays/.
replays: install
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_hot_namespace.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_lost_node.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_transient_spike.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_sustained_overfill.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_rolling_restart.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_drain.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_rebalance.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_initial_indexing.py
	$(BIN)/python -m config.devservers exec -- $(BIN)/python bench/replay_force_reindex.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
