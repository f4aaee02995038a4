# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is a step
# they depend on, so each installs exactly what it needs and no more.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup native-deps controlplane demo test unit e2e bench lint crds

setup: native-deps $(VENV)/.installed

# libxxhash-dev for the optional native key kernel; a no-op when present, a note when it
# cannot be installed (the kernel is then skipped and the Python key path used).
native-deps:
	sh scripts/native-deps.sh

$(VENV)/.installed: pyproject.toml operator/apportion/engine/_keys.c | native-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Builds kube-apiserver, kube-controller-manager, kubectl and etcd once per version into
# ~/.cache/apportion; a no-op when they are cached.
controlplane: setup
	$(BIN)/apportion dev-cluster build

demo: controlplane
	$(BIN)/apportion demo

test: controlplane
	$(BIN)/pytest tests

unit: setup
	$(BIN)/pytest tests/unit

e2e: controlplane
	$(BIN)/pytest tests/e2e

bench: setup
	$(BIN)/python bench/run_all.py

lint: setup
	$(BIN)/ruff check operator tests bench

crds: setup
	$(BIN)/apportion crds --output crds
