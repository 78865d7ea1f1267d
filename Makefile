# mpigate — two commands on a fresh Debian machine with Python 3.11 (as root):
#   make demo   set everything up and run the main job on the bundled example org
#   make test   set everything up and run the test suite (+ lint)
# Everything lives in .venv; Debian packages are installed with apt-get when missing.

SHELL := /bin/bash
# Debian's python3.11 where there is one: the interpreter the image ships (Debian builds it with PGO
# and LTO; the suite and the webhook's CPU figures run on what production runs, and faster than on
# a plain source build such as pyenv's); else the python3 on PATH.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mpigate-installed
# Debian packages the tests and the demo use (OpenMPI and MPICH for the real MPI tests, Chromium for
# the report rendering test, git for revisions, a C compiler and the Python headers for the mypyc
# build, python3-venv for the venvs). Installed only when missing. Debian's mpich and openmpi-bin
# both offer mpirun through alternatives (Open MPI keeps it: priority 50 against 40); the tests
# call MPICH's own /usr/bin/mpiexec.hydra, never plain mpirun.
DEB_PACKAGES ?= git openmpi-bin libopenmpi-dev mpich iproute2 chromium gcc python3-dev python3-venv
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one more than the cores — the workers spend much of their time
# waiting (servers, subprocesses, MPI runs taking turns); on 2 cores 3 workers ran the pure suite in
# 393 s where 2 took 421 s and 516 s (back to back, load 3.4-6; docs/building.md). 0: one process.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# The mypyc-compiled build (docs/building.md): a wheel built with the mypyc hook, installed
# non-editable into a second venv; `make test` runs the engine's tests against it as well.
CVENV ?= .venv-compiled
CBIN := $(CVENV)/bin
CSTAMP := $(CVENV)/.mpigate-installed
COMPILED_INPUTS := $(shell find src policies quotas rbac networkpolicies templates webhooks examples \
  -type f -not -name '*.pyc' -not -name '*.so' 2>/dev/null)
# make rebuilds a stamp when an input is newer than it, which misses an input that was deleted (a
# module removed from src/ stayed in the compiled wheel and the image). build/.input-files lists
# the inputs and is rewritten only when that list changes, so it is newer than the stamps exactly
# when a file came or went (tests/test_buildcache.py).
INPUT_LIST := build/.input-files
$(shell mkdir -p build && new=$$(mktemp build/.input-files.XXXXXX) && \
  printf '%s\n' $(sort $(COMPILED_INPUTS)) > "$$new" && \
  if cmp -s "$$new" $(INPUT_LIST); then rm -f "$$new"; else mv -f "$$new" $(INPUT_LIST); fi)
# tests/config without the tests of its interpreted modules alone (the YAML reader, units, the
# schemas): run on the compiled build they run the same interpreted code again.
COMPILED_TESTS ?= tests/policy tests/trainjob tests/kueue/test_model.py tests/admission/test_examples.py \
  tests/admission/test_review.py tests/admission/test_fuzz.py tests/admission/test_server.py \
  tests/admission/test_deadline.py tests/admission/test_inline.py tests/admission/test_workers.py \
  tests/admission/test_limits.py tests/admission/test_faults.py tests/admission/test_slow_clients.py \
  tests/admission/test_fastpath.py tests/admission/test_null_recorder.py tests/admission/test_metrics.py \
  tests/config --ignore=tests/config/test_yamlsource.py \
  --ignore=tests/config/test_units.py --ignore=tests/config/test_schema.py tests/render/test_render.py \
  tests/test_catalogue.py tests/test_build.py tests/audit/test_records.py tests/cel_k8s/test_reads.py

.PHONY: all demo test kubectl-client test-stages test-compiled compiled lint format docs lock system-deps venv clean help report-screenshot image test-image

all: test

help:
	@echo "make demo    - set up and run the demo on the example org"
	@echo "make test    - set up, run the tests and lint"
	@echo "make lint    - ruff + mypy --strict on src/mpigate"
	@echo "make compiled - build the mypyc-compiled wheel into dist/ and install it into $(CVENV)"
	@echo "make image   - build the OCI image, its oci-archive and SBOM into build/image (root)"
	@echo "make test-image - build the image if needed and run tests/image against it"
	@echo "make docs    - regenerate generated docs (config reference)"
	@echo "make lock    - refresh constraints.txt from the current venv"
	@echo "make report-screenshot - regenerate docs/img/report.png (headless Chromium)"

system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $$missing >/dev/null)); \
	  else echo "warning: missing Debian packages:$$missing (run as root or install them)"; fi; \
	fi

# Packages are installed with uv (pinned in constraints.txt, bootstrapped with pip): the same
# versions as pip would install (constraints.txt), in about a tenth of pip's time.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt uv
	$(BIN)/python -m uv pip install -q --python $(BIN)/python -c constraints.txt -e '.[dev,clients]'
	@touch $@

venv: $(STAMP)

# The wheel is built from an sdist (pip unpacks it into a temporary directory) so that mypyc's
# in-place extension modules never land in src/, where the editable .venv would import them.
$(CSTAMP): $(STAMP) $(COMPILED_INPUTS) $(INPUT_LIST)
	rm -rf build/compiled dist/mpigate-*-cp*-*.whl
	$(BIN)/python -m hatchling build -t sdist -d build/compiled
	HATCH_BUILD_HOOK_ENABLE_MYPYC=true $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation \
	  -w dist build/compiled/mpigate-*.tar.gz
	@test -x $(CBIN)/python || $(PYTHON) -m venv $(CVENV)
	wheel=$$(ls dist/mpigate-*-cp*-*.whl) && \
	  $(BIN)/python -m uv pip install -q --python $(CBIN)/python -c constraints.txt "$$wheel[dev]" && \
	  $(BIN)/python -m uv pip install -q --python $(CBIN)/python --no-deps --reinstall "$$wheel"
	@touch $@

compiled: $(CSTAMP)

# The compiled modules' tests against the compiled build (tests/test_build.py fails unless its
# modules really are the compiled ones).
test-compiled: compiled
	MPIGATE_BUILD=compiled $(CBIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(COMPILED_TESTS)

# `make test` runs every stage even when one fails (CI shows every problem at once), then says
# which stages failed, with each stage's time, and fails. A stage is the command in stage-NAME.
# The compiled build (mypyc type-checks, then one C compiler process: minutes of one core) starts
# in the background when the stages start, unless stage-compiled is overridden, and the compiled
# modules' tests start as soon as it is built, beside the stages still running; the compiled stage
# waits for both and shows their output ($(COMPILED_BUILD_LOG), $(COMPILED_TESTS_LOG)). The pure
# suite's workers spend much of their time waiting (servers, subprocesses, timeouts, MPI runs
# taking turns): 423 s of CPU in 625 s of wall for its 2 workers on 2 cores (load 2-8), so the
# build and the compiled tests mostly fill time it leaves the cores idle instead of adding theirs.
TEST_STAGES ?= pytest lint compiled
COMPILED_BUILD_LOG ?= build/compiled-build.log
COMPILED_TESTS_LOG ?= build/compiled-tests.log
compiled-build = $(MAKE) --no-print-directory compiled
compiled-tests = $(MAKE) --no-print-directory test-compiled
stage-pytest = $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)
stage-lint = $(MAKE) --no-print-directory lint
stage-compiled = { wait $$build_pid; tests_rc=$$?; build_rc=$$(cat $(COMPILED_BUILD_LOG).rc); \
  cat $(COMPILED_BUILD_LOG); \
  echo "(compiled build: exit $$build_rc after $$(cat $(COMPILED_BUILD_LOG).time)s, beside the stages before)"; \
  [ "$$build_rc" = 0 ] && cat $(COMPILED_TESTS_LOG) && \
  echo "(compiled tests: exit $$tests_rc after $$(cat $(COMPILED_TESTS_LOG).time)s, beside the stages before)"; \
  [ "$$build_rc" = 0 ] && [ $$tests_rc = 0 ]; }
build-in-background = $(and $(filter compiled,$(TEST_STAGES)),$(filter-out command line,$(origin stage-compiled)))

# The client tests (tests/apiserver) run the kubectl binaries the machine has (the image ships
# several under /usr/lib/google-cloud-sdk/bin); where there is none, Debian's kubernetes-client.
kubectl-client:
	@if ! ls /usr/lib/google-cloud-sdk/bin/kubectl* >/dev/null 2>&1 && ! command -v kubectl >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages: kubernetes-client"; \
	    (apt-get install -y -q --no-install-recommends kubernetes-client >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends kubernetes-client >/dev/null)); \
	  else echo "warning: no kubectl (install kubernetes-client); the kubectl tests are skipped"; fi; \
	fi

test: system-deps kubectl-client venv
	@$(MAKE) --no-print-directory test-stages

test-stages:
	@failed=""; summary=""; build_pid=""; \
	$(if $(build-in-background),mkdir -p $(dir $(COMPILED_BUILD_LOG)) $(dir $(COMPILED_TESTS_LOG)); \
	  { start=$$SECONDS; $(compiled-build) >$(COMPILED_BUILD_LOG) 2>&1; rc=$$?; \
	    echo $$((SECONDS - start)) >$(COMPILED_BUILD_LOG).time; echo $$rc >$(COMPILED_BUILD_LOG).rc; \
	    [ $$rc = 0 ] || exit $$rc; start=$$SECONDS; $(compiled-tests) >$(COMPILED_TESTS_LOG) 2>&1; rc=$$?; \
	    echo $$((SECONDS - start)) >$(COMPILED_TESTS_LOG).time; exit $$rc; } & build_pid=$$!;) \
	$(foreach stage,$(TEST_STAGES),echo "== make test: $(stage)"; start=$$SECONDS; \
	  if $(stage-$(stage)); then result=ok; else result=FAILED; failed="$$failed $(stage)"; fi; \
	  summary="$$summary $(stage):$$result($$((SECONDS - start))s)";) \
	echo "== make test:$$summary"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED stage(s):$$failed"; exit 1; fi; \
	echo "make test: every stage passed"

# The OCI image (docs/operations.md#the-image): built without a container daemon with mmdebstrap and
# umoci (scripts/image/build.sh, as root), reproducible with SOURCE_DATE_EPOCH (default: the last
# commit's time). Rebuilt when what goes into it changes. `make test-image` builds it and runs
# tests/image (the image's rootfs serving real reviews); `make test` does not build it.
IMAGE_DEB_PACKAGES := mmdebstrap umoci
IMAGE_TOOLS := build/image-tools
IMAGE_INPUTS := pyproject.toml constraints.txt README.md $(wildcard scripts/image/*) $(COMPILED_INPUTS) $(INPUT_LIST)

$(IMAGE_TOOLS)/.installed: scripts/image/tools-constraints.txt
	@test -x $(IMAGE_TOOLS)/bin/python || $(PYTHON) -m venv $(IMAGE_TOOLS)
	$(IMAGE_TOOLS)/bin/python -m pip install -q -c scripts/image/tools-constraints.txt cyclonedx-bom
	@touch $@

# The image installs the mypyc-compiled wheel of `make compiled` (the build the webhook's performance
# figures are for; docs/building.md). IMAGE_BUILD=pure: the pure-Python wheel instead;
# IMAGE_WHEEL=path: that wheel. After switching, `rm -rf build/image` (the digest is not rebuilt).
IMAGE_BUILD ?= compiled
IMAGE_WHEEL ?=
image-wheel = $(or $(IMAGE_WHEEL),$(if $(filter compiled,$(IMAGE_BUILD)),$$(ls dist/mpigate-*-cp3*-*.whl)))
build/image/digest: $(STAMP) $(IMAGE_TOOLS)/.installed $(IMAGE_INPUTS) \
  $(or $(IMAGE_WHEEL),$(if $(filter compiled,$(IMAGE_BUILD)),$(CSTAMP)))
	@$(MAKE) --no-print-directory system-deps DEB_PACKAGES="$(IMAGE_DEB_PACKAGES)"
	@test "$$(id -u)" = 0 || { echo "make image: needs root (mmdebstrap --mode=root, chroot)"; exit 2; }
	@case "$(IMAGE_BUILD)" in compiled|pure) ;; \
	  *) echo "make image: IMAGE_BUILD is compiled or pure, not '$(IMAGE_BUILD)'"; exit 2;; esac
	@wheel="$(image-wheel)"; if [ -z "$$wheel" ] && [ "$(IMAGE_BUILD)" = compiled ]; then \
	  echo "make image: no compiled wheel in dist/ (rm $(CSTAMP) and run make compiled)"; exit 2; fi
	PY=$(BIN)/python IMAGE_TOOLS=$(IMAGE_TOOLS) IMAGE_WHEEL="$(image-wheel)" bash scripts/image/build.sh

# system-deps first: the compiled wheel needs a C compiler and the Python headers
image: system-deps build/image/digest

test-image: image
	$(BIN)/python -m pytest -q tests/image

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

docs: venv
	$(BIN)/python -m mpigate.config.reference > docs/config-reference.md
	$(BIN)/python scripts/gen_policy_docs.py

demo: system-deps venv
	@PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

report-screenshot: system-deps venv
	$(BIN)/python -m tests.report.chromium --out docs/img/report.png

lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf $(VENV) $(CVENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
