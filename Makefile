# The README's commands. `make test` is what CI runs (.ci/run); it sets itself up first.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup setup-demo test test-fast lint demo cloud-demo cloud-protection soak bench reproduce clean module-map

all: test

# Everything: every extra (gmd[agent] builds libvirt-python: Debian's libvirt-dev and gcc),
# and, for `make test`, the tests' PostgreSQL and libvirtd. Needs root for apt on a fresh machine.
setup:
	@bash tests/scripts/bootstrap.sh

# Only what the demo runs: gmd-daemon, gmd-admin, and gmd-agent replaying traces, which needs no
# libvirt. No libvirt-python, so no compiler and no libvirt headers: without root, as long as
# Python's venv module is there (else bootstrap.sh installs python3-venv, as root, and says so).
# A .venv that `make setup` made already has all of it and is used as it is.
setup-demo:
	@GMD_EXTRAS=daemon,admin bash tests/scripts/bootstrap.sh

lint: setup
	@bash tests/scripts/lint.sh

# Everything, with everything (tests/scripts/test.sh says what and in which order): every Debian
# package and server the tests use, installed where missing and started (a private PostgreSQL,
# libvirtd with QEMU, real Keystone, Nova and Placement from PyPI, a three-node ZooKeeper ensemble
# from Debian, the whole small cloud whose Nova boots real guests), then the lint, then the suite
# in two tiers: every test but those on real VMs on every core at nice 10 (beside them, at the
# machine's priority, the soaks and the tests held to 2 s ZooKeeper sessions: they wait on
# intervals, use little CPU and miss deadlines when starved), then alone the tests on real VMs
# (they measure what a guest gets of the CPU). Stops what it started. Tests of the one real cloud, or of the one streaming replica
# (started by its tests' fixture), run on one worker (xdist_group).
test: setup
	@bash tests/scripts/test.sh

# The quick loop while editing (under three minutes from a fresh clone on 2 cores, docs/
# benchmarks.md): every extra but gmd[agent] (libvirt-python is built against Debian's
# headers: root), so no root where Python's venv module is installed; ruff; and the unit and
# repository tests that need no server (PostgreSQL, real VMs, OpenStack, ZooKeeper) and are
# not slow (tests/conftest.py marks them), on every core. A test that needs libvirt-python or a
# program not installed here is skipped, saying which (tests/support/needs.py). `make test`
# runs everything, with everything.
test-fast:
	@GMD_EXTRAS=dev,postgres,daemon,admin,openstack,keystone,osc,broker,nova bash tests/scripts/bootstrap.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	GMD_FAST=1 $(BIN)/pytest -q -n auto -m "not postgres and not realvm and not openstack and not slow and not zookeeper and not soak" tests/unit tests/repository

# A small cloud on this machine: gmd-daemon on SQLite, one gmd-agent per simulated host
# replaying real Bitbrains VMs, then standings, reports, explain, enforcement and a plot
# (files under var/demo). `gmd-admin demo --help` for its options.
demo: setup-demo
	@$(BIN)/gmd-admin demo

# The same story in a real small OpenStack cloud on this machine (tests/scripts/nova_cloud.sh:
# Keystone, Placement, Glance, RabbitMQ and Nova on libvirt/QEMU; root; about 1.7 GB while it runs):
# members boot real servers, gmd-agent measures them, gmd-daemon caps the greedy project's guests
# and lowers its Nova quota, its member's next boot is refused, then both are put back (files
# under var/cloud-demo). The README says how long it takes. The cloud is stopped at the end.
cloud-demo: setup
	@cloud=$$(bash tests/scripts/nova_cloud.sh) && \
		$(BIN)/python -m tests.support.cloud_demo "$$cloud"; \
		status=$$?; bash tests/scripts/nova_cloud.sh stop; exit $$status

# In the same cloud: does gmd protect a moderate project's work? acme's member boots three servers
# that spin, initech's one that runs a job of a known size again and again; initech's job time is
# measured alone, beside acme's servers with gmd off, and with gmd on, and said in words (about
# 7 min; files under var/cloud-protection; bench/protection.py has the figures in full).
cloud-protection: setup
	@cloud=$$(bash tests/scripts/nova_cloud.sh) && \
		$(BIN)/python -m tests.support.cloud_protection "$$cloud"; \
		status=$$?; bash tests/scripts/nova_cloud.sh stop; exit $$status

# gmd's processes under faults drawn from seeds, against an oracle (bench/soak.py; docs/operations.md
# says what each fault does): PostgreSQL with a streaming replica, then SQLite, for each seed.
# The daemons verify against the tests' real Placement (a stub of the soak's if it cannot start);
# beside each seed's PostgreSQL run, gmd-brokers over a ZooKeeper ensemble of the soak's own.
# Root, for full filesystems. `make soak SOAK_SECONDS=900 SOAK_SEEDS=1,2` is an hour of soak.
SOAK_SECONDS ?= 900
SOAK_SEEDS ?= 1,2
soak: setup
	@GMD_WITH_POSTGRES=1 bash tests/scripts/bootstrap.sh
	@bash tests/scripts/zookeeper.sh install
	@cloud=$$(bash tests/scripts/openstack.sh) || cloud=; \
		GMD_TEST_OPENSTACK=$$cloud $(BIN)/python bench/soak.py --seconds $(SOAK_SECONDS) \
		--seeds $(SOAK_SEEDS); status=$$?; bash tests/scripts/openstack.sh stop; exit $$status

# Each benchmark prints its figures as JSON on its last line; docs/benchmarks.md has the latest.
bench: setup
	@GMD_WITH_POSTGRES=1 bash tests/scripts/bootstrap.sh
	$(BIN)/python bench/accounting.py --vms 100000 --hosts 5000
	$(BIN)/python bench/ledger_accounting.py --database postgresql
	$(BIN)/python bench/ledger_accounting.py --database sqlite
	$(BIN)/python bench/ledger_growth.py
	$(BIN)/python bench/ingest.py --batches 300
	$(BIN)/python bench/burst.py
	$(BIN)/python bench/burst.py --spread-s 20
	$(BIN)/python bench/purge.py
	$(BIN)/python bench/purge.py --database sqlite
	$(BIN)/python bench/placement.py
	$(BIN)/python bench/whatif.py
	$(BIN)/python bench/simulate.py
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/replay.py --vms 1-100 --days 3 --tick 300 --interval 900
	$(BIN)/python bench/demo.py
	$(BIN)/python bench/broker.py
	$(BIN)/python bench/read_load.py
	$(BIN)/python bench/protection.py

# docs/reproduction.md's tables from docs/reproduction-protocol.toml: every study on every seed
# (runs cached under var/reproduce, so an interrupted run resumes), then the tables rewritten.
# PWA: the directory holding the Parallel Workloads Archive's logs the protocol names.
PWA ?= var/pwa
reproduce: setup
	$(BIN)/python -m gmd.sim.reproduce run --pwa $(PWA)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# docs/development.md's map of every module, made again from the tree (tests/repository/test_docs.py
# fails while it differs).
module-map:
	@$(BIN)/python tests/support/module_map.py --write
