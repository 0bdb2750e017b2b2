# The README's commands. `make test` is what CI runs (.ci/run); it sets itself up first.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup test lint demo bench clean

all: test

setup:
	@bash tests/bootstrap.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The tests use a real PostgreSQL (tests/postgres.sh starts a private cluster and prints its
# URL) and a real libvirtd with QEMU (tests/libvirt.sh installs and starts them).
test: lint
	@GMD_WITH_POSTGRES=1 bash tests/bootstrap.sh
	@bash tests/libvirt.sh >/dev/null
	@url=$$(bash tests/postgres.sh) && GMD_TEST_POSTGRES_URL=$$url $(BIN)/pytest

demo: setup
	@for s in A11 A12 A13 A14 S31 S32 S33 T5; do \
		$(BIN)/gmd-admin gm --scenario $$s || exit 1; echo; \
	done

# Each benchmark prints its figures as JSON on its last line; the README has the latest.
bench: setup
	@GMD_WITH_POSTGRES=1 bash tests/bootstrap.sh
	$(BIN)/python bench/accounting.py --vms 100000 --hosts 5000
	$(BIN)/python bench/ledger_accounting.py --database postgresql
	$(BIN)/python bench/ledger_accounting.py --database sqlite
	$(BIN)/python bench/ingest.py --batches 300
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/agent.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
