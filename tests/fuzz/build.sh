#!/usr/bin/env bash
# Build an instrumented copy of zarr_fused under build/<variant>/, leaving the
# checkout's own in-place extensions alone (tests or benchmarks may be using
# them). Use it with PYTHONPATH=build/<variant>; see docs/fuzzing.md.
#
#   asan  gcc, AddressSanitizer + UndefinedBehaviorSanitizer (make test-asan)
#   fuzz  clang, the same sanitizers plus libFuzzer's coverage counters
#         (-fsanitize=fuzzer-no-link), for atheris (make fuzz)
#
# Prints the directory. Re-running only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
variant=${1:?usage: tests/fuzz/build.sh asan|fuzz}
PY=${PY:-${VENV:-.venv}/bin/python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; esac  # the build below runs in $out
out=build/$variant

common="-fno-omit-frame-pointer -g -O1"
case $variant in
  asan)
    cc=${CC:-gcc}
    cflags="-fsanitize=address,undefined -fno-sanitize-recover=undefined $common"
    ldflags="-fsanitize=address,undefined"
    ;;
  fuzz)
    cc=${FUZZ_CC:-clang}
    command -v "$cc" >/dev/null || { echo "build.sh: $cc not found (apt-get install clang)" >&2; exit 1; }
    cflags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined $common"
    # not linked against clang's runtimes (Debian keeps them in a separate
    # package): the sanitizer and libFuzzer symbols come from atheris'
    # asan_with_fuzzer.so, preloaded at run time
    ldflags=""
    ;;
  *) echo "build.sh: unknown variant $variant" >&2; exit 2 ;;
esac

mkdir -p "$out/zarr_fused"
# sources only, subpackages included: never the checkout's .so or generated
# .c files (setup.py's EXTENSIONS says what to compile)
cp -p setup.py pyproject.toml README.md "$out/"
while IFS= read -r f; do
  mkdir -p "$out/$(dirname "$f")"
  cmp -s "$f" "$out/$f" || cp -p "$f" "$out/$f"
done < <(find zarr_fused -path '*/__pycache__' -prune -o -type f \
           \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.h' \) -print)
(
  cd "$out"
  CC=$cc ZARR_FUSED_EXTRA_CFLAGS="$cflags" ZARR_FUSED_EXTRA_LDFLAGS="$ldflags" \
    "$PY" setup.py -q build_ext --inplace >/dev/null
)
echo "$out"
