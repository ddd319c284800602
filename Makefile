# zarr_fused developer entry points. `make demo` and `make test` work on a
# fresh machine: both start by running tools/bootstrap.sh.

VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

.PHONY: bootstrap build demo test test-unit conformance sdist clean

bootstrap:
	@bash tools/bootstrap.sh

build: bootstrap

demo: bootstrap
	$(PY) -m zarr_fused demo

# our own tests, then zarr's conformance suites against zarr_fused
test: bootstrap
	$(PY) -m pytest tests
	$(PY) tests/conformance/run.py

test-unit: bootstrap
	$(PY) -m pytest tests

conformance: bootstrap
	$(PY) tests/conformance/run.py

sdist: bootstrap
	$(PY) -m build --sdist --no-isolation --outdir dist

clean:
	rm -rf build dist *.egg-info zarr_fused/*.so zarr_fused/*.c
