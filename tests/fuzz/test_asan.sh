#!/usr/bin/env bash
# make test-asan: build zarr_fused with AddressSanitizer and
# UndefinedBehaviorSanitizer under build/asan (tests/fuzz/build.sh asan) and
# run the kernel, shard and fuzz-corpus tests on it. Any sanitizer report
# ends the run with an error. The tests are those tests/fuzz/asan_tests.txt
# lists (CI's selection) and ASAN_EXTRA_TESTS (make test-asan: the slow
# shard-write suite); ASAN_TESTS replaces the list. ASAN_PYTEST_ARGS adds
# pytest options (make test: two xdist workers).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-${VENV:-.venv}/bin/python}
CC=${CC:-gcc}
ASAN_TESTS=${ASAN_TESTS:-$(sed -e 's/#.*//' tests/fuzz/asan_tests.txt)}

build=$(CC=$CC PY="$PY" bash tests/fuzz/build.sh asan)
libasan=$($CC -print-file-name=libasan.so)
libubsan=$($CC -print-file-name=libubsan.so)
# CPython is not built with ASan: the runtime must be loaded first. Python
# keeps objects alive until exit by design, so leak checking is off.
# PYTHONMALLOC=malloc: small Python objects (the bytes of a small chunk or
# index) come from malloc, not from pymalloc's arenas, so an overread of
# them lands in an ASan redzone instead of a neighbouring object.
# PYTHONSAFEPATH (-P, inherited by xdist's workers) keeps the checkout
# itself off sys.path, so `zarr_fused` is build/asan's, and
# ZARR_FUSED_EXPECT_BUILD makes tests/conftest.py check that it is.
# --capture=sys leaves file descriptor 2 alone: a sanitizer report written
# there just before the abort is not lost in pytest's capture file.
# shellcheck disable=SC2086
PYTHONPATH="$PWD/$build" PYTHONSAFEPATH=1 ZARR_FUSED_EXPECT_BUILD="$PWD/$build" \
  LD_PRELOAD="$libasan $libubsan" PYTHONMALLOC=malloc \
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  "$PY" -P -m pytest -q --capture=sys ${ASAN_PYTEST_ARGS:-} $ASAN_TESTS ${ASAN_EXTRA_TESTS:-}
