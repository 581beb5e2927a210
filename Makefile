# vidroute developer commands. `make up` and `make test` are the two a newcomer needs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Two installs: `make up` needs only the runtime dependencies (RUNTIME_INSTALLED: `pip install -e .`);
# tests, lint and the tools need the dev extra too (INSTALLED: `-e '.[dev]'`, a superset).
INSTALLED := $(VENV)/.installed
RUNTIME_INSTALLED := $(VENV)/.installed-runtime
PIP := $(PY) -m pip install --disable-pip-version-check -c constraints.txt
NODE_INSTALLED := node_modules/.installed
# google-genai 2.34.x for the Gemini-API SDK test; cannot share .venv with the 3.x in constraints.
SDK_GENAI2 := $(VENV)/sdk-genai2
SDK_GENAI2_REQ := tests/integration/sdk/genai2-requirements.txt
BENCH_LITELLM := .venv-bench-litellm

.PHONY: up test test-long lint typecheck dists proto proto-check buf-lint buf-breaking bench bench-routing bench-routing-quality stress clean

$(INSTALLED): pyproject.toml constraints.txt
	@test -x $(PY) || { echo "==> creating $(VENV) ($(PYTHON))"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing pip, then vidroute with its dev dependencies into $(VENV)"
	$(PIP) --quiet pip
	$(PIP) --quiet -e '.[dev]'
	@touch $@ $(RUNTIME_INSTALLED)

# What `make up` installs: the runtime dependencies only, with pip's progress shown.
$(RUNTIME_INSTALLED): pyproject.toml constraints.txt
	@test -x $(PY) || { echo "==> [1/3] creating $(VENV) ($(PYTHON))"; $(PYTHON) -m venv $(VENV); }
	@echo "==> [2/3] installing pip"
	$(PIP) --quiet pip
	@echo "==> [3/3] installing vidroute and its runtime dependencies (not the dev tools)"
	$(PIP) --progress-bar on -e .
	@touch $@

$(SDK_GENAI2)/.installed: $(SDK_GENAI2_REQ) | $(INSTALLED)
	rm -rf $(SDK_GENAI2)
	$(PY) -m pip install --quiet --disable-pip-version-check --target $(SDK_GENAI2) -r $(SDK_GENAI2_REQ)
	sha256sum $(SDK_GENAI2_REQ) | cut -d' ' -f1 > $@   # the SDK tests reinstall on a mismatch

$(NODE_INSTALLED): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## The whole platform on embedded defaults (SQLite, in-process leases), in the foreground.
## ARGS go to `vidroute up`, e.g. `make up ARGS=--ephemeral-ports`.
ARGS ?=
up: $(RUNTIME_INSTALLED)
	$(VENV)/bin/vidroute up $(ARGS)

## The whole test suite, PostgreSQL and Redis tests included, on TEST_WORKERS processes
## (pytest-xdist). Each test file runs whole on one worker (--dist loadfile), so a module's
## shared stack starts once; every worker has its own databases, Redis databases and ports.
## Files go out in collection order (--no-loadscope-reorder: xdist would send the files with the
## most tests first, leaving the long one-test e2e files for the end). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
## Every Python process of a run (the workers, each sidecar, control plane and CLI process the
## tests start) reads cached bytecode from PYCACHE, outside the tree, even where the environment
## sets PYTHONDONTWRITEBYTECODE: without a cache each of them compiles the whole package again
## (a worker's collection 15.5 s CPU, 6.8 s cached; a `vidroute` process start 3.0 s, 2.0 s).
PYCACHE := $(abspath $(VENV))/pycache
WITH_PYCACHE = env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(PYCACHE)
test: $(INSTALLED) $(NODE_INSTALLED) $(SDK_GENAI2)/.installed
	bash scripts/ensure_services.sh
	$(WITH_PYCACHE) $(PY) -m pytest $(PYTEST_PARALLEL)

## The same with the property tests at their long sizes (tests/support/sizes.py).
test-long: $(INSTALLED) $(NODE_INSTALLED) $(SDK_GENAI2)/.installed
	bash scripts/ensure_services.sh
	$(WITH_PYCACHE) $(PY) -m pytest $(PYTEST_PARALLEL) --long

## The CI gates before the tests (.ci/run): ruff lint and format, mypy strict on the packages
## and on the tests, every `type: ignore` with a code and a reason, buf lint, and buf breaking
## against the earlier contracts in history. Each step says what failed and how to fix it.
LINT_FAIL = { echo; echo "make lint: FAILED at $(1)"; echo "  fix: $(2)"; exit 1; }
lint: $(INSTALLED) $(NODE_INSTALLED)
	@echo "==> [1/7] ruff check"
	@$(VENV)/bin/ruff check . || $(call LINT_FAIL,ruff check,.venv/bin/ruff check --fix . fixes many; the rest by hand (or a noqa with its reason))
	@echo "==> [2/7] ruff format --check"
	@$(VENV)/bin/ruff format --check . || $(call LINT_FAIL,ruff format --check,.venv/bin/ruff format .)
	@echo "==> [3/7] mypy (strict) on the packages"
	@$(VENV)/bin/mypy || $(call LINT_FAIL,mypy on the packages,fix the types; a needed ignore is  # type: ignore[code]  # why)
	@echo "==> [4/7] mypy on the tests"
	@$(VENV)/bin/mypy --explicit-package-bases tests || $(call LINT_FAIL,mypy on the tests,fix the types; a needed ignore is  # type: ignore[code]  # why)
	@echo "==> [5/7] every type: ignore has an error code and a reason"
	@$(PY) scripts/check_type_ignores.py || $(call LINT_FAIL,check_type_ignores,write  # type: ignore[code]  # why  (or fix the typing and drop it))
	@echo "==> [6/7] buf lint"
	@npx --no-install buf lint || $(call LINT_FAIL,buf lint,see buf.yaml (STANDARD + COMMENTS): name and comment as the message says)
	@echo "==> [7/7] buf breaking against the earlier contracts"
	@bash scripts/buf_breaking.sh || $(call LINT_FAIL,buf breaking,keep the old contract (deprecate; reserve numbers) or add a new package version)
	@echo "make lint: all gates passed"

## mypy strict on the packages, then on the tests (also steps 3-4 of `make lint`).
typecheck: $(INSTALLED)
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --explicit-package-bases tests

## The deployable wheels (packaging/*/pyproject.toml) into dist/; k8s/Dockerfile builds the same.
dists: $(INSTALLED)
	$(PY) scripts/build_dists.py --out dist

## Regenerate vidroute/ from proto/ (commit the result).
proto: $(INSTALLED)
	$(PY) scripts/gen_proto.py

buf-lint: $(NODE_INSTALLED)
	npx --no-install buf lint

## Breaking-change check of proto/ against the proto/ of each of the last 10 commits that
## changed it (FILE rules, see buf.yaml; BUF_BREAKING_DEPTH=N to look further back).
buf-breaking: $(NODE_INSTALLED)
	bash scripts/buf_breaking.sh

## LiteLLM for the side-by-side routing benchmark, in its own environment (never constraints.txt).
$(BENCH_LITELLM)/.installed: bench/requirements-litellm.txt
	rm -rf $(BENCH_LITELLM)
	$(PYTHON) -m venv $(BENCH_LITELLM)
	$(BENCH_LITELLM)/bin/pip install --quiet --disable-pip-version-check -r bench/requirements-litellm.txt
	@touch $@

## One routing decision at 8/64/256 candidates, side by side with LiteLLM's Router (bench/RESULTS.md).
bench-routing: $(INSTALLED) $(BENCH_LITELLM)/.installed
	$(PY) -m bench.routing

## How well routing decides (issue 26): a scripted degradation over the whole stack, the shipped
## routing against cheapest-first, lowest-latency-first and an oracle (bench/RESULTS.md).
## ARGS=... passes options (--tasks-per-phase, --rate, --scale, --json PATH).
bench-routing-quality: $(INSTALLED)
	bash scripts/ensure_services.sh
	$(PY) -m bench.routing_quality $(ARGS)

## Every benchmark, one after the other, in one command (the figures go to bench/RESULTS.md):
## routing side by side with LiteLLM, then each module of BENCH_MODULES that exists (the
## lifecycle under py-spy, so it prints its CPU profile by component too).
BENCH_MODULES := queue dispatch reconciliation create_task money lifecycle shards rss_serve routing_quality
bench: $(INSTALLED) $(BENCH_LITELLM)/.installed
	bash scripts/ensure_services.sh
	$(PY) -m bench.routing --e2e
	@set -e; for m in $(BENCH_MODULES); do \
	  args=; if [ $$m = lifecycle ]; then args=--profile; fi; \
	  if [ -f bench/$$m.py ]; then echo "== bench.$$m $$args"; $(PY) -m bench.$$m $$args; fi; \
	done

## One test N times beside a CPU hog (one spinner per core, HOG=k to choose), with pass/fail
## counts: `make stress TEST=tests/e2e/test_redis_loss.py N=20`. ARGS go to pytest.
N ?= 20
stress: $(INSTALLED) $(NODE_INSTALLED) $(SDK_GENAI2)/.installed
	bash scripts/ensure_services.sh
	$(WITH_PYCACHE) bash scripts/stress_tests.sh $(TEST) $(N) -- $(ARGS)

clean:
	rm -rf $(VENV) $(BENCH_LITELLM) node_modules var dist .pytest_cache .mypy_cache .ruff_cache
