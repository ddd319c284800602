#!/usr/bin/env bash
# Prepare a development environment for zarr_fused, from nothing:
#   1. find a Python >= 3.12 (PATH, then pyenv's versions, then the system);
#   2. install the native build dependencies from apt when missing (as root);
#   3. create .venv and install zarr_fused (editable) with its test extras;
#   4. build the Cython extensions in place.
# Re-running is cheap: the venv is reused, dependencies are reinstalled only
# when pyproject.toml or setup.py change, and the build is incremental.
#
# Environment: PYTHON (interpreter to use), VENV (default .venv),
# EXTRAS (default "test,bench,docs"), ZARR_FUSED_SKIP_APT=1 (never call apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,bench,docs}

say() { printf 'bootstrap: %s\n' "$*" >&2; }

# find_python / usable: shared with the asv dashboard script
# shellcheck source=tools/find_python.sh
source "$(dirname "$0")/find_python.sh"

apt_install() {
  if [ "${ZARR_FUSED_SKIP_APT:-0}" = 1 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing build dependencies: $*; install them with your package manager"
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      say "missing build dependencies: $*; run as root: apt-get install -y $*"
      return 1
    fi
  fi
  say "installing from apt: $*"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

PY=$(find_python) || {
  say "no Python >= 3.12 found on PATH, in pyenv ($(pyenv root 2>/dev/null || echo ~/.pyenv)/versions) or in /usr/bin."
  say "install one (e.g. 'pyenv install 3.13' or 'apt-get install python3.13-venv python3.13-dev') or set PYTHON=/path/to/python3.12+"
  exit 1
}

# -- native build dependencies ------------------------------------------------
# A C compiler, the interpreter's own headers (Python.h) and the C libraries
# the codec kernels link (header -> Debian package).
missing=()
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
for pair in zstd.h:libzstd-dev zlib.h:zlib1g-dev libdeflate.h:libdeflate-dev blosc.h:libblosc-dev \
  lz4.h:liblz4-dev; do
  header=${pair%%:*}
  if ! printf '#include <%s>\n' "$header" | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
    missing+=("${pair##*:}")
  fi
done
if ! "$PY" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  missing+=("python${ver}-dev")
fi
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}" || exit 1
fi

# Optional: Open MPI for tests/test_mpi.py (mpirun -n 2); without it that
# test skips with a message.
if ! command -v mpirun >/dev/null 2>&1; then
  apt_install openmpi-bin libopenmpi-dev || say "Open MPI not installed: the MPI test will skip"
fi

# -- virtual environment --------------------------------------------------------
if [ -x "$VENV/bin/python" ] && usable "$VENV/bin/python"; then
  :
else
  say "creating $VENV with $PY ($("$PY" --version 2>&1))"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

pip_quiet() {  # pip install, without the noise of unreachable local mirrors
  "$VPY" -m pip install -q --disable-pip-version-check "$@" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
}

want="$(cat pyproject.toml setup.py testing/pyproject.toml | sha256sum | cut -c1-16) extras=$EXTRAS"
stamp="$VENV/.zarr_fused-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing zarr_fused[$EXTRAS] and its dependencies into $VENV"
  pip_quiet "setuptools>=77" "Cython>=3.1" "numpy>=2" wheel
  pip_quiet --no-build-isolation -e ".[$EXTRAS]"
  # the servers and cluster the tests and benchmarks share (development only)
  pip_quiet --no-build-isolation --no-deps -e testing
  echo "$want" > "$stamp"
fi

# -- extensions (incremental) ------------------------------------------------------
"$VPY" setup.py -q build_ext --inplace >/dev/null
"$VPY" - <<'PY'
import zarr_fused
info = zarr_fused.native_info()
missing = [name for name, ok in info["extensions"].items() if not ok]
if missing:
    raise SystemExit(f"bootstrap: extensions failed to import: {missing}")
PY
say "ready: $("$VPY" --version) in $VENV"
