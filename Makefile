# agentscope tasks. `make test` is what CI runs (.ci/run calls exactly it).
PY ?= .venv/bin/python
DISTRO ?=
MANAGER ?= both
K ?=
# Distros booted at once (each VM idles much of its time under TCG).
JOBS ?= 2
VM_ARGS = $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d))) -m $(MANAGER) $(if $(K),-k "$(K)") -j $(JOBS)

.PHONY: help venv check lint typecheck unit integration images test demo bench clean-vm

help:
	@echo "make demo          the main job: a fleet in a VM, a runaway agent, the guard's kill named"
	@echo "make test          checks, host tests and the whole VM matrix (what CI runs)"
	@echo "make check         ruff, ruff format --check, mypy --strict"
	@echo "make unit          host tests"
	@echo "make integration   the VM matrix; narrow it: DISTRO=bookworm MANAGER=user K=smoke"
	@echo "make images        build (or reuse) the cached VM images"

venv: $(PY)
$(PY): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check '.[dev]' hatchling
	@touch $(PY)

lint: venv
	$(PY) -m ruff check agentscope cli tests integration benchmarks
	$(PY) -m ruff format --check agentscope cli tests integration benchmarks

typecheck: venv
	$(PY) -m mypy --strict agentscope cli

check: lint typecheck

unit: venv
	$(PY) -m pytest tests

images: venv
	$(PY) integration/vm.py --build-only $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d)))

integration: venv
	$(PY) integration/vm.py $(VM_ARGS)

test: check unit integration

# The demo boots trixie (building its image on first use) and runs
# `agentscope demo` there as the lingering user, the runaway uncapped, on
# Debian's kernel defaults: the guard's catch.
demo: venv
	$(PY) integration/vm.py -d trixie -m user --timeout 600 --run "agentscope demo --global-oom"

clean-vm:
	rm -rf /var/tmp/agentscope-vm

BENCH ?= bench_launch.py
bench: venv
	$(PY) integration/vm.py --bench $(BENCH) $(if $(DISTRO),$(foreach d,$(DISTRO),-d $(d)),-d trixie) -m $(MANAGER)
