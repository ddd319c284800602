#!/usr/bin/env bash
# The quick asv run (part of CI): every benchmark once, on the working tree
# as installed in .venv (no build), on small data, results not kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export ZARR_FUSED_BENCH_SCALE=${ZARR_FUSED_BENCH_SCALE:-small}
export ZARR_FUSED_BENCH_QUICK=${ZARR_FUSED_BENCH_QUICK:-1}
export ZARR_FUSED_BENCH_DIR=${ZARR_FUSED_BENCH_DIR:-$PWD/.cache/bench-data}
"$VENV/bin/asv" machine --yes --config asv_bench/asv.conf.json >/dev/null
# --dry-run: run everything, store nothing; a benchmark that errors fails the run
out=$("$VENV/bin/asv" run --python=same --quick --dry-run --show-stderr \
      --config asv_bench/asv.conf.json "$@" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E "^\[|failed|Error" | grep -v " ok$" || true
if echo "$out" | grep -qE "failed|Traceback"; then
  echo "$out" | grep -B2 -A20 -E "failed|Traceback" | head -80
  echo "asv quick run: some benchmarks failed" >&2
  exit 1
fi
echo "asv quick run: $(echo "$out" | grep -cE ' ok$') benchmarks ran"
