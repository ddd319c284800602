#!/usr/bin/env bash
# make fuzz: run every fuzz target (or FUZZ_TARGET) for FUZZ_SECONDS each,
# seeded with FUZZ_SEED, on a build instrumented for coverage and
# AddressSanitizer (tests/fuzz/build.sh fuzz). Needs atheris (installed
# into the venv when missing) and clang (from apt when missing and root);
# without clang the targets run on the normal build, with coverage of
# zarr_fused's Python code only. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-${VENV:-.venv}/bin/python}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_SEED=${FUZZ_SEED:-1}
FUZZ_TARGET=${FUZZ_TARGET:-all}
say() { printf 'fuzz: %s\n' "$*" >&2; }

if ! "$PY" -c "import atheris" 2>/dev/null; then
  say "installing atheris into $("$PY" -c 'import sys; print(sys.prefix)')"
  "$PY" -m pip install -q --disable-pip-version-check "atheris==3.1.0" \
    || say "atheris did not install: the seeded mutation engine runs instead"
fi
if ! command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
   && [ "${ZARR_FUSED_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing clang from apt"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang >/dev/null
fi

preload=""
if command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1 \
   && atheris_dir=$("$PY" -c "import atheris; print(atheris.path())" 2>/dev/null) \
   && [ -f "$atheris_dir/asan_with_fuzzer.so" ]; then
  build=$(PY="$PY" bash tests/fuzz/build.sh fuzz)
  export PYTHONPATH="$PWD/$build" ZARR_FUSED_FUZZ_BUILD=1
  preload="$atheris_dir/asan_with_fuzzer.so"
else
  say "no clang or no atheris: fuzzing the normal build (Python coverage only)"
  export PYTHONPATH="$PWD"
fi
# Any one allocation above 64 MiB fails (MemoryError in Python) instead of
# happening: zarr's codecs (the oracle) allocate what a corrupt header claims,
# which is zarr's verdict; in zarr_fused it is a violation. (libFuzzer's own
# -malloc_limit_mb would end the run on the oracle's allocations too.)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=64}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# small Python objects from malloc, so ASan sees overreads of small chunks
[ -n "$preload" ] && export PYTHONMALLOC=malloc
LD_PRELOAD=$preload exec "$PY" -P tests/fuzz/run.py --target "$FUZZ_TARGET" \
  --seconds "$FUZZ_SECONDS" --seed "$FUZZ_SEED" "$@"
