#!/usr/bin/env python
"""Draw the performance figure of the docs from a recorded side-by-side run.

Reads the text that ``asv_bench/side_by_side.py`` printed (the files in
``docs/_data/``), and draws one grouped bar chart per CPU setting (unpinned,
pinned to one CPU): for every benchmark case, the speedup of zarr_fused over
each peer, i.e. the peer's median time divided by zarr_fused's (the
"zarr_fused speedup" column of the recorded tables). Above 1, zarr_fused was
faster; below 1, the peer was.

    python docs/plot_performance.py                  # writes docs/_static/performance.png
    python docs/plot_performance.py --markdown       # also prints the tables of the page

The figure is not drawn at documentation build time: rerun this script after
recording a new run, and commit the PNG with the data it was drawn from.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "_data"
RUN_FILES = ["bench_unsharded.txt", "bench_sharded.txt", "bench_patterns.txt"]
OUTPUT = HERE / "_static" / "performance.png"
MACHINE = (
    "2026-11-30, 2 vCPUs Intel Xeon, 24 GiB, Debian 12, Python 3.13.0, zarr 3.4.2, "
    "zarrs-python 0.2.3, tensorstore 0.1.86"
)
OURS = "zarr_fused"
# peers in the order of the bars, with the legend text
PEERS = {
    "zarr-batched": "zarr BatchedCodecPipeline (zarr's default)",
    "zarr-fused": "zarr FusedCodecPipeline (zarr's opt-in)",
    "zarrs": "zarrs-python (ZarrsCodecPipeline)",
    "tensorstore": "tensorstore (zarr3 driver)",
}


@dataclass
class Table:
    """One ``## title`` block of a side-by-side report."""

    scenario: str
    pinned: bool
    rounds: int
    title: str
    #: peer -> {"median", "min", "cpu", "gbps" (optional), "speedup"}
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    per_call_us: dict[str, float] = field(default_factory=dict)
    #: peer -> "k/n": slices of small reads in which zarr_fused was faster
    slices_won: dict[str, str] = field(default_factory=dict)

    @property
    def row_name(self) -> str:
        """The name of this case in the page's tables."""
        t = self.title
        if t.startswith("thin slab"):
            return "thin slab `a[100:101]`"
        if "reads of one inner chunk" in t:
            return f"{t.split()[0]} reads of one inner chunk each"
        op, rest = t.split(":", 1)
        layout = rest.split("(")[0].strip()
        size = rest.split(",")[-1].strip(" )")
        return f"{op.replace(' all', '')} `{layout}` ({size})"

    @property
    def label(self) -> str:
        """A short name for the x axis."""
        t = self.title
        if t.startswith("thin slab"):
            return "thin slab\na[100:101]"
        if "reads of one inner chunk" in t:
            return f"{t.split()[0]} reads of\none inner chunk"
        op, rest = t.split(":", 1)
        name = rest.split("(")[0].strip()
        size = rest.split(",")[-1].strip(" )")
        name = name.replace("f32-2048sq-", "").replace("u16-512cube-", "")
        return f"{op.replace(' all', '')}\n{name}\n({size})"


_SCENARIO = re.compile(r"^# scenario (\S+), store (\S+), CPUs \[([^\]]*)\] \((\w+)\), (\d+) rounds")


def parse(text: str) -> list[Table]:
    """The tables of one side_by_side.py report."""
    tables: list[Table] = []
    scenario, pinned, rounds = "", False, 0
    columns: list[str] = []
    for line in text.splitlines():
        m = _SCENARIO.match(line)
        if m:
            scenario, pinned, rounds = m.group(1), m.group(4) == "pinned", int(m.group(5))
            continue
        if line.startswith("## "):
            tables.append(Table(scenario, pinned, rounds, line[3:].strip()))
            continue
        if line.startswith("peer "):
            columns = ["median", "min", "cpu"] + (["gbps"] if "GB/s" in line else []) + ["speedup"]
            continue
        if line.startswith("per call (us):"):
            for part in line.split(":", 1)[1].split(","):
                peer, value = part.split()
                tables[-1].per_call_us[peer] = float(value)
            continue
        if line.startswith("slices of ") and "faster:" in line:
            for part in line.split(":", 1)[1].split(","):
                _, peer, won = part.split()
                tables[-1].slices_won[peer] = won
            continue
        fields = line.split()
        if tables and len(fields) == len(columns) + 1:
            values = [float(v.rstrip("x")) for v in fields[1:]]
            tables[-1].rows[fields[0]] = dict(zip(columns, values))
    return tables


def load(files: list[Path]) -> list[Table]:
    tables: list[Table] = []
    for path in files:
        tables += parse(path.read_text())
    return tables


def plot(tables: list[Table], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    settings = [
        (False, "unpinned: both CPUs"),
        (True, "pinned to CPU 0 (zarr_fused uses 1 thread)"),
    ]
    fig, axes = plt.subplots(len(settings), 1, figsize=(12, 9.5), sharey=True)
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    width = 0.8 / len(PEERS)
    for ax, (pinned, heading) in zip(axes, settings):
        group = [t for t in tables if t.pinned == pinned]
        x = np.arange(len(group))
        for k, (peer, legend) in enumerate(PEERS.items()):
            values = [t.rows.get(peer, {}).get("speedup", np.nan) for t in group]
            pos = x + (k - (len(PEERS) - 1) / 2) * width
            # bars start at parity (1), so a slower case points down
            heights = [v - 1 for v in values]
            bars = ax.bar(pos, heights, width, bottom=1, label=legend, color=colors[k], zorder=2)
            for bar, v in zip(bars, values):
                if np.isnan(v):
                    continue
                ax.annotate(
                    f"{v:.2f}",
                    (bar.get_x() + bar.get_width() / 2, v),
                    xytext=(0, 2 if v >= 1 else -2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if v >= 1 else "top",
                    fontsize=6.5,
                    rotation=90,
                )
        ax.axhline(1.0, color="black", linewidth=1, zorder=3)
        for i in range(1, len(group)):  # separate unsharded, sharded and small-read cases
            if group[i].scenario != group[i - 1].scenario:
                ax.axvline(i - 0.5, color="#999999", linewidth=0.8, linestyle="--", zorder=1)
        ax.set_yscale("log")
        ax.set_ylim(0.1, 60)
        ax.set_yticks([0.25, 0.5, 1, 2, 4, 8, 16, 32])
        ax.set_yticklabels(["0.25", "0.5", "1", "2", "4", "8", "16", "32"])
        ax.set_xticks(x)
        ax.set_xticklabels([t.label for t in group], fontsize=8)
        ax.grid(axis="y", which="major", color="#dddddd", zorder=0)
        ax.set_title(heading, fontsize=10, loc="left")
        ax.set_ylabel("zarr_fused speedup\n(peer time / zarr_fused time)", fontsize=9)
        ax.text(
            0.995,
            0.97,
            "above 1: zarr_fused faster\nbelow 1: the peer is faster",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "#bbbbbb"},
        )
    axes[0].legend(loc="upper center", ncol=2, fontsize=8, frameon=True, bbox_to_anchor=(0.42, 1.0))
    fig.suptitle(
        "zarr_fused against its peers, local store (median of interleaved rounds)\n" + MACHINE,
        fontsize=10,
    )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    # no Software tag: the file changes only when the data or the figure do
    fig.savefig(output, dpi=130, metadata={"Software": None})
    plt.close(fig)


def markdown(tables: list[Table]) -> str:
    """The tables of the performance page, as MyST/Markdown."""
    out: list[str] = []

    def ratio(t: Table, peer: str) -> str:
        row = t.rows.get(peer)
        if row is None:
            return "–"
        text = f"{row['speedup']:.2f}×"
        return f"**{text}**" if row["speedup"] < 1 else text

    for pinned in (False, True):
        arrays = [t for t in tables if t.pinned == pinned and "gbps" in t.rows.get(OURS, {})]
        if arrays:
            out.append(f"<!-- {'pinned' if pinned else 'unpinned'}: whole arrays -->")
            out.append(
                "| operation | zarr_fused s | GB/s | vs zarr-batched | vs zarr-fused "
                "| vs zarrs | vs tensorstore |"
            )
            out.append("|---|---:|---:|---:|---:|---:|---:|")
            for t in arrays:
                r = t.rows[OURS]
                out.append(
                    f"| {t.row_name} | {r['median']:.4f} | {r['gbps']:.2f} | "
                    + " | ".join(ratio(t, p) for p in PEERS)
                    + " |"
                )
            out.append("")
        small = [t for t in tables if t.pinned == pinned and "gbps" not in t.rows.get(OURS, {})]
        if small:
            out.append(f"<!-- {'pinned' if pinned else 'unpinned'}: small reads -->")
            out.append(
                "| operation | zarr_fused s | zarr-fused s | zarrs s | tensorstore s "
                "| vs zarr-fused | vs zarrs | vs tensorstore |"
            )
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
            for t in small:
                m = {p: t.rows[p]["median"] for p in t.rows}
                out.append(
                    f"| {t.row_name} | {m[OURS]:.4f} | {m['zarr-fused']:.4f} | "
                    f"{m['zarrs']:.4f} | {m['tensorstore']:.4f} | "
                    + " | ".join(ratio(t, p) for p in ("zarr-fused", "zarrs", "tensorstore"))
                    + " |"
                )
            for t in small:
                if t.per_call_us:
                    out.append("")
                    out.append(
                        "per call: "
                        + ", ".join(f"{p} {v:.0f} µs" for p, v in t.per_call_us.items())
                    )
                if t.slices_won:
                    out.append("")
                    out.append(
                        "slices of 256 calls in which zarr_fused was faster: "
                        + ", ".join(f"than {p} {w}" for p, w in t.slices_won.items())
                    )
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="side_by_side.py reports (default: the recorded run in docs/_data)",
    )
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    parser.add_argument("--markdown", action="store_true", help="also print the page's tables")
    args = parser.parse_args(argv)
    tables = load(args.files or [DATA / name for name in RUN_FILES])
    if not tables:
        parser.error("no side_by_side.py tables found in the input")
    for t in tables:
        if OURS not in t.rows:
            parser.error(f"table {t.title!r} has no {OURS} row")
    plot(tables, args.output)
    print(f"wrote {args.output} ({len(tables)} tables)", file=sys.stderr)
    if args.markdown:
        print(markdown(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
