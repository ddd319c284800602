# zarr_fused developer entry points. `make demo` and `make test` work on a
# fresh machine: both start by running tools/bootstrap.sh.

VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

.PHONY: bootstrap build demo test test-unit lint conformance bench-quick docs dashboard \
	dashboard-test sdist wheel wheel-test clean fuzz fuzz-ci test-asan

bootstrap:
	@bash tools/bootstrap.sh

build: bootstrap

demo: bootstrap
	$(PY) -m zarr_fused demo

# the lint target first (it is quick, and a finding fails CI before the long
# runs); our tests; the kernel, shard and corpus tests under ASan/UBSan
# (without the slow shard-write suite, which `make test-asan` adds); the short
# seeded fuzz budget; zarr's whole test suite against zarr_fused; the quick
# asv run and the docs build (warnings are errors)
# Our tests run on 2 pytest-xdist workers, a test file each at a time (a
# file's servers and clusters start once); every step prints its duration
# ("ci step NAME: N s"), so a slow CI log shows where the time went.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile
STEP := bash tools/timed.sh
test: bootstrap lint
	$(STEP) pytest $(PY) -m pytest $(PYTEST_PARALLEL) tests
	$(STEP) asan env ASAN_PYTEST_ARGS="$(PYTEST_PARALLEL)" PY=$(PY) bash tests/fuzz/test_asan.sh
	$(STEP) fuzz env FUZZ_SECONDS=10 FUZZ_SEED=1 FUZZ_TARGET=all PY=$(PY) bash tests/fuzz/fuzz.sh
	$(STEP) conformance $(PY) tests/conformance/run.py
	$(STEP) asv-quick bash tools/asv_quick.sh
	$(STEP) docs $(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

test-unit: bootstrap
	$(PY) -m pytest $(PYTEST_PARALLEL) tests

# ruff (lint, and the formatter in check mode), mypy over zarr_fused against
# the .pyi stubs, cython-lint over the .pyx/.pxd files, and the package's
# structure (import cycles, depth, long functions); every check runs, and
# the target fails if any of them found something. cython-lint runs
# pycodestyle, found on PATH.
lint: bootstrap
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/cython-lint zarr_fused || status=1; \
	$(PY) tools/check_structure.py || status=1; \
	exit $$status

conformance: bootstrap
	$(PY) tests/conformance/run.py

bench-quick: bootstrap
	bash tools/asv_quick.sh

docs: bootstrap
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# asv over the last 3 commits of main, published to .asv/html
dashboard: bootstrap
	bash tools/asv_dashboard.sh 3

# renders the published dashboard in headless Chromium (needs `make dashboard`)
dashboard-test: bootstrap
	$(PY) -m pytest -m dashboard tests/test_dashboard.py

# coverage-guided fuzzing (atheris) of the parsers of stored bytes, on a
# clang build with AddressSanitizer under build/fuzz (docs/fuzzing.md):
#   make fuzz FUZZ_SECONDS=600 FUZZ_TARGET=shard-partial FUZZ_SEED=7
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 1
FUZZ_TARGET ?= all
fuzz: bootstrap
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_TARGET=$(FUZZ_TARGET) \
		PY=$(PY) bash tests/fuzz/fuzz.sh

# the short, seeded budget CI runs
fuzz-ci: bootstrap
	FUZZ_SECONDS=10 FUZZ_SEED=1 FUZZ_TARGET=all PY=$(PY) bash tests/fuzz/fuzz.sh

# the kernel, shard and fuzz-corpus tests on extensions built with
# AddressSanitizer and UndefinedBehaviorSanitizer under build/asan (the
# checkout's own extensions are not touched): CI's selection and the slow
# shard-write suite
test-asan: bootstrap
	ASAN_EXTRA_TESTS=tests/test_shard_write.py PY=$(PY) bash tests/fuzz/test_asan.sh

sdist: bootstrap
	$(PY) -m build --sdist --no-isolation --outdir dist

# the sdist, then a portable wheel built from it with libzstd, zlib, c-blosc
# and lz4 (numcodecs' versions) linked in statically, for glibc 2.17
# (manylinux2014); sources fetched and cached under .cache/wheel
# (docs/installing.md)
wheel: bootstrap
	PY=$(PY) bash tools/build_wheel.sh

# the wheel in a fresh venv inside a minimal Debian root (no compiler, no
# -dev packages); root only, not part of `make test` (docs/installing.md)
wheel-test:
	bash tools/wheel_test.sh

clean:
	rm -rf build dist *.egg-info zarr_fused/*.so zarr_fused/*.c docs/_build
