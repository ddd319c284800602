#!/usr/bin/env python
"""Make a published asv dashboard work without internet access.

asv's pages load jQuery, flot, bootstrap and a few small plugins from CDNs,
which machines without internet (this one, many HPC login nodes) cannot
reach: the dashboard then shows only asv's "dependencies failed to load"
page. The asv 0.5.1 source distribution ships the same libraries (the
versions asv's pages are written for); this script downloads it once into
the cache, copies those files next to the published HTML and points the
pages at them.

    python tools/asv_offline.py .asv/html
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "asv-vendor"
SDIST = "asv==0.5.1"

# CDN file (last path component, as asv's pages name it) -> vendored file
VENDOR = {
    "jquery-3.3.1.min.js": "jquery-3.3.1.min.js",
    "jquery.flot.min.js": "jquery.flot-0.8.3.min.js",
    "jquery.flot.time.min.js": "jquery.flot-0.8.3.time.min.js",
    "jquery.flot.selection.min.js": "jquery.flot-0.8.3.selection.min.js",
    "jquery.flot.categories.min.js": "jquery.flot-0.8.3.categories.min.js",
    "jquery.flot.orderBars.js": "jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupidtable.js",
    "md5.min.js": "md5.js",
    "bootstrap.min.js": "bootstrap-3.1.0.min.js",
    "bootstrap.min.css": "bootstrap-3.1.0.min.css",
}


def vendor_files() -> Path:
    """The directory holding the vendored files (downloaded on first use)."""
    target = CACHE / "vendor"
    if all((target / name).is_file() for name in VENDOR.values()):
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            SDIST,
            "-d",
            str(CACHE),
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    (archive,) = CACHE.glob("asv-0.5.1.tar.gz")
    target.mkdir(exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if "/asv/www/vendor/" in member.name and member.isfile():
                member.name = Path(member.name).name
                tar.extract(member, target, filter="data")
    missing = [n for n in VENDOR.values() if not (target / n).is_file()]
    if missing:
        raise SystemExit(f"asv_offline: {archive} lacks {missing}")
    return target


TAG = re.compile(r'(<(?:script|link)\b[^>]*?\b(?:src|href)=")(https?://[^"]+)("[^>]*>)')


def localize(html: str) -> str:
    def swap(match: re.Match[str]) -> str:
        name = match.group(2).rsplit("/", 1)[-1]
        if name not in VENDOR:
            return match.group(0)
        rest = re.sub(r'\s+(integrity|crossorigin|referrerpolicy)="[^"]*"', "", match.group(3))
        return f"{match.group(1)}vendor/{VENDOR[name]}{rest}"

    return TAG.sub(swap, html)


def main(argv: list[str]) -> int:
    html_dir = Path(argv[0] if argv else ROOT / ".asv" / "html")
    source = vendor_files()
    shutil.copytree(source, html_dir / "vendor", dirs_exist_ok=True)
    for page in html_dir.glob("*.html"):
        page.write_text(localize(page.read_text()))
    left = [p.name for p in html_dir.glob("*.html") if re.search(r'src="https?://', p.read_text())]
    if left:
        raise SystemExit(f"asv_offline: pages still load scripts from the internet: {left}")
    print(f"asv_offline: {html_dir} now loads its scripts from {html_dir / 'vendor'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
