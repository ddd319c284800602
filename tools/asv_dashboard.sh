#!/usr/bin/env bash
# The asv dashboard: benchmark the last N commits of main (default 3) in a
# virtualenv built per commit by asv, publish the HTML to .asv/html, and say
# how to look at it. Data scale: ZARR_FUSED_BENCH_SCALE (small by default
# here, "full" for the sizes the benchmarks are named after).
#
#   tools/asv_dashboard.sh [N] [--preview]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
N=${1:-3}
# shellcheck source=tools/find_python.sh
source tools/find_python.sh
PY=$(find_python) || { echo "asv_dashboard: no Python >= 3.12 found" >&2; exit 1; }
VERSION=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
# asv looks the interpreter up by version on PATH
export PATH="$(dirname "$PY"):$PATH"
export ZARR_FUSED_BENCH_SCALE=${ZARR_FUSED_BENCH_SCALE:-small}
export ZARR_FUSED_BENCH_QUICK=${ZARR_FUSED_BENCH_QUICK:-1}  # the trimmed grid; 0 for all of it
export ZARR_FUSED_BENCH_DIR=${ZARR_FUSED_BENCH_DIR:-$PWD/.cache/bench-data}
mkdir -p .asv
git rev-list --max-count="$N" main > .asv/commits.txt
"$VENV/bin/asv" machine --yes --config asv_bench/asv.conf.json >/dev/null
"$VENV/bin/asv" run -E "virtualenv:$VERSION" --skip-existing-successful --show-stderr \
  --config asv_bench/asv.conf.json "HASHFILE:$PWD/.asv/commits.txt"
"$VENV/bin/asv" publish --config asv_bench/asv.conf.json
# asv's pages load their scripts from CDNs: serve them from the dashboard
"$VENV/bin/python" tools/asv_offline.py .asv/html
echo "dashboard: $PWD/.asv/html/index.html (serve it: $VENV/bin/asv preview --config asv_bench/asv.conf.json)"
if [ "${2:-}" = "--preview" ]; then
  exec "$VENV/bin/asv" preview --config asv_bench/asv.conf.json
fi
