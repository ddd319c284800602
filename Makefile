# zarr_fused developer entry points. `make demo` and `make test` work on a
# fresh machine: both start by running tools/bootstrap.sh.

VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

.PHONY: bootstrap build demo test test-unit conformance bench-quick docs dashboard \
	dashboard-test sdist clean

bootstrap:
	@bash tools/bootstrap.sh

build: bootstrap

demo: bootstrap
	$(PY) -m zarr_fused demo

# our tests, zarr's conformance suites against zarr_fused, the quick asv run
# and the docs build (warnings are errors)
test: bootstrap
	$(PY) -m pytest tests
	$(PY) tests/conformance/run.py
	bash tools/asv_quick.sh
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

test-unit: bootstrap
	$(PY) -m pytest tests

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

sdist: bootstrap
	$(PY) -m build --sdist --no-isolation --outdir dist

clean:
	rm -rf build dist *.egg-info zarr_fused/*.so zarr_fused/*.c docs/_build
