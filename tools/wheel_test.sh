#!/usr/bin/env bash
# `make wheel-test`: install the portable wheel from dist/ (`make wheel`) into
# a fresh venv inside a minimal Debian root (debootstrap minbase: no
# compiler, no -dev package, no system libzstd, libdeflate or libblosc) and run
# tools/wheel_smoke.py there: `zarr-fused info` reports the bundled
# libraries, sharded zstd/blosc/gzip/crc32c arrays written in strict mode
# read back with zarr's values, stored bytes equal zarr's at every zstd and
# blosc level. Needs root (debootstrap, chroot). The root is Debian trixie,
# whose python3 is 3.13 (zarr needs >= 3.12), cached in .cache/wheel/ so
# re-runs take a minute; pip inside it installs zarr and numcodecs from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOTFS=$PWD/.cache/wheel/root-trixie
SUITE=${SUITE:-trixie}
wheel=$(ls dist/zarr_fused-*-manylinux*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
    echo "wheel-test: no wheel in dist/ (run make wheel first)" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "wheel-test: needs root (debootstrap, chroot)" >&2
    exit 1
fi

if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
    # the Debian mirror this machine's apt uses
    mirror=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v security | head -1)
    mirror=${mirror:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)}
    rm -rf "$ROOTFS.tmp"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$ROOTFS.tmp" "$mirror"
    mv "$ROOTFS.tmp" "$ROOTFS"
fi

# what the root must not have: a C compiler, compression -dev packages, a
# system c-blosc or libdeflate (libzstd1 and zlib1g stay: dpkg and python3 need them; the
# wheel's extensions must not load them, checked with ldd below)
for tool in cc gcc clang; do
    if chroot "$ROOTFS" sh -c "command -v $tool" >/dev/null; then
        echo "wheel-test: the root has a compiler ($tool)" >&2
        exit 1
    fi
done
present=$(chroot "$ROOTFS" dpkg-query -W -f '${Package}\n' \
    | grep -E '^(libzstd-dev|zlib1g-dev|libblosc-dev|libblosc1|liblz4-dev|libdeflate-dev|libdeflate0)$' \
    || true)
if [ -n "$present" ]; then
    echo "wheel-test: the root has $present" >&2
    exit 1
fi

work=$ROOTFS/tmp/zf
rm -rf "$work"
mkdir -p "$work"
cp "$wheel" tools/wheel_smoke.py "$work/"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
trap 'umount "$ROOTFS/proc" 2>/dev/null || true' EXIT
# a clean environment in the root (no pip settings of this machine's that
# name its paths), but this machine's CA bundle, for a network that
# reaches PyPI through its own certificates
cp /etc/ssl/certs/ca-certificates.crt "$work/ca.crt"
in_root() { chroot "$ROOTFS" env -i PATH=/usr/bin:/bin HOME=/root PIP_CERT=/tmp/zf/ca.crt "$@"; }
in_root python3 -m venv /tmp/zf/venv
in_root /tmp/zf/venv/bin/pip install --quiet --disable-pip-version-check \
    "/tmp/zf/$(basename "$wheel")"
linked=$(chroot "$ROOTFS" sh -c 'ldd /tmp/zf/venv/lib/python3*/site-packages/zarr_fused/*.so' \
    | grep -E 'libzstd|libblosc|liblz4|libdeflate|libz\.so' || true)
if [ -n "$linked" ]; then
    echo "wheel-test: the extensions load system libraries: $linked" >&2
    exit 1
fi
in_root sh -c 'cd /tmp && /tmp/zf/venv/bin/python /tmp/zf/wheel_smoke.py'
