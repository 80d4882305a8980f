# agentscope tasks. `make test` is what CI runs (.ci/run calls exactly it).
PY ?= .venv/bin/python
DISTRO ?=
MANAGER ?= both
K ?=
# EVERYWHERE=1: the heavy tests in every suite, not two (integration/tests/conftest.py).
EVERYWHERE ?=
# Distros booted at once (each VM idles much of its time under TCG).
JOBS ?= 2
VM_ARGS = $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d))) -m $(MANAGER) $(if $(K),-k "$(K)") -j $(JOBS) $(if $(EVERYWHERE),--everywhere)

.PHONY: help venv gate host-deps check lint typecheck unit lowest node-test integration images test demo bench clean-vm dashboard-shot man docs

help:
	@echo "make demo          the main job: a fleet in a VM, a runaway agent, the guard's kill named"
	@echo "make test          checks, host tests and the whole VM matrix (what CI runs)"
	@echo "make check         ruff, ruff format --check, mypy --strict"
	@echo "make unit          host tests (the Node client's too: make node-test)"
	@echo "make lowest        host tests on the lowest versions pyproject.toml allows"
	@echo "make integration   the VM matrix; narrow it: DISTRO=bookworm MANAGER=user K=smoke"
	@echo "make images        build (or reuse) the cached VM images"
	@echo "make dashboard-shot  docs/img/dashboard.png from dashboards/sample/ (needs prometheus)"
	@echo "make docs          docs/cli.md and the man pages (man/), generated from the CLI"

# The stamp is a file of our own: $(PY) is a symlink to the system interpreter,
# and touching it would follow the link (Permission denied as a user; as root
# it would change the system python's timestamp).
VENV_STAMP = .venv/.agentscope-dev
venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml
	@python3 -c 'import ensurepip, venv' 2>/dev/null || { echo "make: python3 has no venv module: apt-get install python3-venv" >&2; exit 1; }
	python3 -m venv .venv
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check '.[dev]' hatchling
	@touch $(VENV_STAMP)

# The VM runner alone (make demo): the standard library, pip and hatchling to
# build the wheel; none of the development toolchain.
VM_PY = .venv-vm/bin/python
VM_STAMP = .venv-vm/.agentscope-vm
$(VM_STAMP): pyproject.toml
	python3 -m venv .venv-vm
	$(VM_PY) -m pip install --quiet --disable-pip-version-check hatchling
	@touch $(VM_STAMP)

# What the VM runner needs on the host, checked before any download; as root
# on Debian or Ubuntu it is installed (integration/host-deps.sh says what).
host-deps:
	@bash integration/host-deps.sh

lint: venv
	$(PY) -m ruff check agentscope_systemd tests integration benchmarks dashboards deploy native hatch_build.py
	$(PY) -m ruff format --check agentscope_systemd tests integration benchmarks dashboards deploy native hatch_build.py

typecheck: venv
	$(PY) -m mypy --strict agentscope_systemd

check: lint typecheck

# The compiled launch gate beside _spawn.py in this checkout, as a wheel has it
# (hatch_build.py): the host tests import the checkout, not the venv's copy.
# Without a C compiler it is not built and the gate runs in Python (said).
GATE = agentscope_systemd/_fleet/agentscope-gate
gate: $(GATE)
$(GATE): native/gate.c native/build_gate.py
	python3 native/build_gate.py $@

unit: venv gate
	$(PY) -m pytest tests
	@$(MAKE) --no-print-directory node-test

# The floors of pyproject.toml's dependencies, shown to hold: a venv of its
# own with every direct dependency a user gets (the base, [monitor], [tmux])
# at its declared floor (.ci/floors.py writes the pins; what they pull in
# resolves as pip chooses, and so do the test tools: [test], and pyyaml of
# [dev], which the host tests read the alert rules with), and the host
# tests run against it. CI runs it.
LOW_PY = .venv-lowest/bin/python
LOW_STAMP = .venv-lowest/.agentscope-lowest
$(LOW_STAMP): pyproject.toml .ci/floors.py
	rm -rf .venv-lowest
	python3 -m venv .venv-lowest
	python3 .ci/floors.py monitor tmux > .venv-lowest/floors.txt
	$(LOW_PY) -m pip install --quiet --disable-pip-version-check -c .venv-lowest/floors.txt '.[monitor,tmux,test]' pyyaml
	@touch $(LOW_STAMP)

# -p no:libtmux: the pytest plugin of libtmux 0.37 (its own test helpers,
# none of ours) fails to load under pytest 9; the library is what is tested.
lowest: $(LOW_STAMP) gate
	@echo "lowest: $$(tr '\n' ' ' < .venv-lowest/floors.txt)"
	$(LOW_PY) -m pytest -q -p no:cacheprovider -p no:libtmux tests

# The Node client (clients/node/): its types against schemas/, its calls
# against the CLI's recorded --json and the real read API (served by
# tests/node_face.py with $(PY)). Node from Debian's nodejs package.
node-test: venv
	@if command -v node >/dev/null; then \
		cd clients/node && AGENTSCOPE_PYTHON=$(abspath $(PY)) node --test test/*.test.mjs; \
	else \
		echo "make: node-test SKIPPED: no node on PATH (apt-get install nodejs)" >&2; \
	fi

images: host-deps venv
	$(PY) integration/vm.py --build-only $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d)))

integration: host-deps venv
	$(PY) integration/vm.py $(VM_ARGS)

# host-deps first: a missing qemu is said before the toolchain downloads. The
# VM matrix starts at once, beside the host's checks and tests, the lowest
# floors' run of them included (about 10 of CI's minutes that would otherwise
# come first or last): the VM images (downloads and
# disk work, ~1.5 min each on a fresh machine) are built in the background, a
# VM whose image is still being built waits for it (its build lock), and one
# whose build failed is built again by the matrix, which reports the failure.
# qemu runs at nice 5 meanwhile, so that the host tests' own timing (real
# processes, real signals) does not compete with TCG on equal terms. The
# matrix's table stays the log's last lines; a failed host check is said
# after it.
test: host-deps venv
	@log=$$(mktemp); \
	$(PY) integration/vm.py --build-only $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d))) >$$log 2>&1 & builder=$$!; \
	nice -n 5 $(PY) integration/vm.py $(VM_ARGS) & matrix=$$!; \
	trap 'kill $$builder $$matrix 2>/dev/null; rm -f $$log' EXIT; \
	$(MAKE) --no-print-directory check unit lowest; host=$$?; \
	wait $$matrix; rc=$$?; matrix=; \
	wait $$builder; sed 's/^/[background] /' $$log; \
	if [ $$host -ne 0 ]; then echo "make test: the host's checks or tests FAILED (above, before the matrix's end)" >&2; exit $$host; fi; \
	exit $$rc

# The demo boots trixie (building its image on first use) and runs
# `agentscope demo` there as the lingering user, the runaway uncapped, on
# Debian's kernel defaults: the guard's catch.
demo: host-deps $(VM_STAMP)
	$(VM_PY) integration/vm.py -d trixie -m user --timeout 600 --run "agentscope demo --global-oom"

clean-vm:
	rm -rf /var/tmp/agentscope-vm

BENCH ?= bench_launch.py
bench: host-deps venv
	$(PY) integration/vm.py --bench $(BENCH) $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d)),-d trixie) -m $(MANAGER)

# The dashboard's picture, re-rendered from the committed capture of a VM run:
# Prometheus (Debian: prometheus) evaluates the dashboard's own queries, our
# renderer draws them (matplotlib, the [shot] extra, installed here only).
# A new capture: $(PY) -m dashboards.shot capture (boots trixie; minutes).
dashboard-shot: venv
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { echo "make: dashboard-shot needs prometheus and promtool: apt-get install prometheus" >&2; exit 1; }
	$(PY) -m pip install --quiet --disable-pip-version-check '.[shot]'
	$(PY) -m dashboards.shot render

# Generated from the CLI itself, checked in, and checked by the host tests
# (tests/test_cli.py: docs/cli.md; tests/test_man.py: man/, shipped in the wheel).
docs: venv
	$(PY) -c 'import agentscope_systemd._cli._docs as d; d.write()'
	@$(MAKE) --no-print-directory man

man: venv
	$(PY) -c 'import agentscope_systemd._cli._man as m; m.write()'
