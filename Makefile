# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is a step
# they depend on, so each installs exactly what it needs and no more.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup native-deps node-deps java-deps postgres-deps controlplane tools image kafka-jars demo \
	test krew release version model \
	unit e2e realnode java bench lint crds monitoring argocd-health dashboard tutorial-pictures

setup: native-deps node-deps $(VENV)/.installed

# libxxhash-dev for the optional native key kernel, lua5.1 and lua-dkjson for the Argo CD health
# check tests, redis-server for Argo CD on the dev-cluster (tests/e2e/test_argocd.py), spin for
# the hand-off model's checks (`make model`); a no-op when present, a note when they cannot be
# installed (the kernel is then skipped and the Python key path used; the health check tests
# skip, the Argo CD tests fail). Under CI (CI=true) a missing one fails the setup instead.
native-deps:
	sh scripts/native-deps.sh

$(VENV)/.installed: pyproject.toml devtools/pyproject.toml operator/apportion/engine/_keys.c | native-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e './devtools[postgres]'
	touch $@

# runc, CNI plugins, buildah, iptables, debootstrap for the real node; a no-op when present, a
# note when they cannot be installed (the dev-cluster then runs the pod simulator).
node-deps:
	sh scripts/node-deps.sh

# Builds kube-apiserver, kube-controller-manager, kubectl, etcd and the node's kubelet,
# kube-scheduler, kube-proxy and metrics-server once per version into ~/.cache/apportion; a no-op
# when cached.
controlplane: setup
	$(BIN)/apportion dev-cluster build

# The project's image from the Dockerfile, with buildah (no Docker engine); where the default
# base cannot be pulled, on a local Debian base made first. Layers are cached.
image: setup
	$(BIN)/apportion dev-cluster image

# Builds the Go tools the tests run (promtool, helm, krew, kstatus, argocd-lua, Argo CD and
# kustomize, Flux's source- and kustomize-controller, the registry, the oldest supported
# Kubernetes) once per version into ~/.cache/apportion. `make test` does not wait for
# them: a test run builds what is missing in the background (tests/support/prebuild.py).
tools: setup
	$(BIN)/apportion dev-cluster tools

# The Kafka broker's jars (Maven, integrations/kafka/pom.xml) into ~/.cache/apportion/kafka, for
# the Kafka e2e test and benchmark; a no-op when they are cached.
kafka-jars:
	sh integrations/kafka/fetch-jars.sh

demo: controlplane
	$(BIN)/apportion demo

# The gates (setup, lint, postgres-deps), then four streams side by side: the Go builds and the
# real-node tier; the image; the Java build and the unit tier; the simulator's e2e tier in two pytest-xdist
# workers once its builds are done (scripts/run_tests.py). Ends with how long each step took;
# each tier's log and slowest tests are in .test-results/.
test:
	$(PYTHON) scripts/run_tests.py

# The Spin model of the hand-off protocol (models/handoff/): every safety and liveness
# configuration explored exhaustively and every mutant refuted; prints check, states, memory,
# time, result (docs/handoff.md, "How we know"). tests/unit/test_handoff_spin.py runs the same
# checks; `$(BIN)/python scripts/model_check.py --by-hand` adds those beyond a CI budget.
model: setup
	$(BIN)/python scripts/model_check.py

# One tier at a time, as the streams of `make test` run them.
unit: setup postgres-deps
	$(BIN)/pytest tests/unit --durations=25

e2e: controlplane java kafka-jars
	$(BIN)/pytest tests/e2e -m "not one_per_machine" -n 2 --dist loadfile --durations=25

realnode: controlplane tools image postgres-deps
	$(BIN)/pytest tests/e2e -m one_per_machine --durations=25

# The Java client (clients/java): builds it and runs its JUnit suite on the shared conformance
# cases (conformance/), then installs it into the Maven cache for the Pekko integration
# (integrations/pekko) and the Java Kafka consumer (integrations/kafka-java), which build on it
# and run their JUnit suites. Dependencies are cached in ~/.m2 (MAVEN_REPO
# overrides, e.g. a repo-local cache for CI); the first run downloads them from Maven Central.
MAVEN_REPO ?= $(HOME)/.m2/repository
java-deps:
	sh scripts/java-deps.sh

# PostgreSQL's server binaries: the fenced-write tests of both clients (tests/unit/test_fencing.py,
# clients/java's PostgresFenceTest) start a private server on loopback. A no-op when present.
postgres-deps:
	sh scripts/postgres-deps.sh

java: java-deps postgres-deps
	mvn -q -B -Dmaven.repo.local=$(MAVEN_REPO) -f clients/java/pom.xml install
	mvn -q -B -Dmaven.repo.local=$(MAVEN_REPO) -f integrations/pekko/pom.xml install
	mvn -q -B -Dmaven.repo.local=$(MAVEN_REPO) -f integrations/kafka-java/pom.xml install

bench: setup kafka-jars
	$(BIN)/python -m bench.run_all

# Gates that fail the test run: ruff, mypy (strict on the api and engine layers, every module
# of the package and the harness checked) and the import contracts.
lint: setup
	$(BIN)/ruff check operator devtools tests bench conformance integrations scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

crds: setup
	$(BIN)/apportion crds --output crds

# manifests/monitoring/prometheusrule.yaml from manifests/monitoring/rules.yaml.
# The krew archive of `kubectl apportion` into dist/, and its version and sha256 into
# plugins/krew/apportion.yaml (docs/operations.md#kubectl-plugin).
krew: setup
	$(BIN)/python scripts/krew.py --out dist --update-manifest

# Every artifact of a release into dist/ (docs/releasing.md): VERSION must say VERSION, and
# CHANGELOG.md have its section. RELEASE_FLAGS passes more, e.g. --skip images or --sign.
VERSION ?= $(shell cat VERSION)
RELEASE_FLAGS ?=
release: setup java-deps
	$(BIN)/python scripts/release.py --version $(VERSION) $(RELEASE_FLAGS)

# VERSION and every literal that repeats it, set to VERSION: the commit before a release.
version: setup
	$(BIN)/python scripts/release.py --version $(VERSION) --stamp

monitoring: setup
	$(BIN)/python scripts/prometheus_rule.py

# manifests/argocd/ (the Argo CD health check per kind and the argocd-cm patch) from
# scripts/argocd_health.lua.
argocd-health: setup
	$(BIN)/python scripts/argocd_health.py

# manifests/monitoring/dashboards/apportion.json, the Grafana dashboard of one set, from
# scripts/grafana_dashboard.py (grafana-foundation-sdk).
dashboard: setup
	$(BIN)/python scripts/grafana_dashboard.py

# The pictures of docs/tutorial.md: the simulator's per-pod load over the tutorial's scenarios,
# on the demo's fleet (32 partitions, 4 pods). Seeded: the same command draws the same pictures.
TUTORIAL := docs/tutorial
tutorial-pictures: setup
	$(BIN)/apportion simulate scale-out --units 32 --members 4 --steps 1 --plot-members $(TUTORIAL)/scale-out.png
	$(BIN)/apportion simulate hot-key --units 32 --members 4 --plot-members $(TUTORIAL)/hot-key.png
	$(BIN)/apportion simulate rolling-update --units 32 --members 4 --plot-members $(TUTORIAL)/rolling-update.png
