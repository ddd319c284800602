# Sourced by tools/bootstrap.sh and tools/asv_dashboard.sh: find a Python
# >= 3.12 that can create virtual environments. Order: $PYTHON, then PATH,
# then pyenv's versions (newest first), then the system's /usr/bin.
# Prints the interpreter's path; returns 1 when there is none.

usable() {  # a Python >= 3.12 that can create virtual environments
  "$1" - <<'PY' >/dev/null 2>&1
import sys, venv, ensurepip
sys.exit(0 if sys.version_info >= (3, 12) else 1)
PY
}

find_python() {
  if [ -n "${PYTHON:-}" ]; then
    usable "$PYTHON" && { echo "$PYTHON"; return 0; }
    echo "PYTHON=$PYTHON is not a usable Python >= 3.12 (with venv and ensurepip)" >&2
    return 1
  fi
  local name p root
  for name in python3.14 python3.13 python3.12 python3 python; do
    p=$(command -v "$name" 2>/dev/null) || continue
    usable "$p" && { echo "$p"; return 0; }
  done
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  if [ -d "$root/versions" ]; then
    for p in $(ls -d "$root"/versions/3.* 2>/dev/null | sort -V -r); do
      [ -x "$p/bin/python" ] && usable "$p/bin/python" && { echo "$p/bin/python"; return 0; }
    done
  fi
  for p in /usr/bin/python3.14 /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3; do
    [ -x "$p" ] && usable "$p" && { echo "$p"; return 0; }
  done
  return 1
}

