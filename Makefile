# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is a step
# they depend on, so each installs exactly what it needs and no more.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup native-deps controlplane kafka-jars demo test unit e2e bench lint crds tutorial-pictures

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

# The Kafka broker's jars (Maven, integrations/kafka/pom.xml) into ~/.cache/apportion/kafka, for
# the Kafka e2e test and benchmark; a no-op when they are cached.
kafka-jars:
	sh integrations/kafka/fetch-jars.sh

demo: controlplane
	$(BIN)/apportion demo

test: controlplane kafka-jars
	$(BIN)/pytest tests

unit: setup
	$(BIN)/pytest tests/unit

e2e: controlplane kafka-jars
	$(BIN)/pytest tests/e2e

bench: setup kafka-jars
	$(BIN)/python bench/run_all.py

lint: setup
	$(BIN)/ruff check operator tests bench integrations

crds: setup
	$(BIN)/apportion crds --output crds

# The pictures of docs/tutorial.md: the simulator's per-pod load over the tutorial's scenarios,
# on the demo's fleet (32 partitions, 4 pods). Seeded: the same command draws the same pictures.
TUTORIAL := docs/tutorial
tutorial-pictures: setup
	$(BIN)/apportion simulate scale-out --units 32 --members 4 --steps 1 --plot-members $(TUTORIAL)/scale-out.png
	$(BIN)/apportion simulate hot-key --units 32 --members 4 --plot-members $(TUTORIAL)/hot-key.png
	$(BIN)/apportion simulate rolling-update --units 32 --members 4 --plot-members $(TUTORIAL)/rolling-update.png
