# Cairn: `make run` starts the whole product with demo data; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
# Without DATABASE_URL the suite runs on SQLite and leaves out the PostgreSQL-only tests.
PYTEST_MARKERS := $(if $(DATABASE_URL),,-m "not postgres")

.PHONY: install run test rehearsal chaos chaos-ci lint format bench browser-deps php-deps faketime-deps prometheus-deps promtool-checks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

# Browser tests drive Debian's Chromium (never a downloaded browser).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "Installing Debian's chromium for the browser tests…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The example PHP runner (examples/php/) and its test use Debian's php-cli with php-curl.
php-deps:
	@{ command -v php >/dev/null 2>&1 && php -m | grep -qx curl; } || { \
		echo "Installing Debian's php-cli and php-curl for the PHP runner test…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq php-cli php-curl; }

# The clock-skew tests run real workers under Debian's faketime (a worker whose clock is off).
faketime-deps:
	@command -v faketime >/dev/null 2>&1 || { \
		echo "Installing Debian's faketime for the clock-skew tests…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; }

# promtool checks /metrics, the alert rules (observability/prometheus/) and fires each alert
# in tests/test_metrics_prometheus.py: Debian's prometheus package brings it (the server it
# also installs is never started by the project).
prometheus-deps:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "Installing Debian's prometheus for promtool…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

# The shipped alert rules load (their firing is tested by make test).
promtool-checks: prometheus-deps
	promtool check rules observability/prometheus/cairn-rules.yml

# The console's address: `make run ADDR=127.0.0.1:8011` (seed_demo prints it, cairn_up serves it).
ADDR ?= 127.0.0.1:8000

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --addr $(ADDR)
	$(PY) manage.py cairn_up --addr $(ADDR)

test: install browser-deps php-deps faketime-deps prometheus-deps
	$(PY) -m pytest $(PYTEST_MARKERS) $(PYTEST_ARGS)

# The multi-machine rehearsal alone (web, scheduler and two workers with separate homes on
# PostgreSQL, a real broker and the S3 server); CI runs it inside `make test` on PostgreSQL.
# RABBITMQ=1 runs it on RabbitMQ instead of Redis.
REHEARSAL_BROKER := $(if $(RABBITMQ),CAIRN_TEST_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//,CAIRN_TEST_REDIS_URL=$(or $(CAIRN_TEST_REDIS_URL),redis://127.0.0.1:6379/15))
rehearsal: install
	DATABASE_URL=$(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/cairn) $(REHEARSAL_BROKER) \
		$(PY) -m pytest tests/test_rehearsal_multi_machine.py $(PYTEST_ARGS)

# The chaos rehearsal (tests/chaos_rehearsal.py): its own PostgreSQL cluster and Redis on
# free ports, a web process, a beat and workers as shipped; runs with approvals and
# publications while workers are SIGKILLed, the broker and the database restarted. CI runs
# the bounded one (chaos-ci, about two minutes); `make chaos` is the longer bad day.
CHAOS_ARGS ?= --runs 400 --spread 180 --kill-every 6 --workers 3
chaos: install
	$(PY) -m tests.chaos_rehearsal $(CHAOS_ARGS)

chaos-ci: install
	$(PY) -m tests.chaos_rehearsal --runs 100 --spread 45 --kill-every 8

# ruff, then the layering: the import contracts in pyproject.toml ([tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) var staticfiles
