#!/usr/bin/env python
"""Side-by-side timings under filesystem latency and with a cold page cache.

Models the storage of an HPC batch job (Lustre, GPFS, NFS: every ``open``,
``read``, ``write`` and ``rename`` a round trip of 0.2-2 ms) on a local
disk: the faultfs shim (``tests/shims/faultfs.c``, built here with the
system C compiler) is preloaded into a child process in its delay mode and
makes every such call on the benchmark's files wait ``--latency-us``
microseconds first. Calls in different threads wait independently, as
requests in flight on a network filesystem do. ``--latency-us 0`` runs
without the shim (hot page cache: the regression check); ``--cold`` drops
the page cache (``/proc/sys/vm/drop_caches``, root only; skipped with a
message otherwise) before every timed read, without latency.

    python asv_bench/latency_side_by_side.py --latency-us 1000 200 --pin both
    python asv_bench/latency_side_by_side.py --latency-us 0 --cold --pin both
    python asv_bench/latency_side_by_side.py --chain gzip-f4 --chain delta-i4-zstd \
        --latency-us 1000 200 --pin both

``--chain NAME`` (repeatable) reads chains of the real-data catalogue
(`zarr_fused_testing.chains`) instead of the default arrays: each written
by zarr's Batched pipeline, unsharded and (format 3) sharded, and read whole
by every peer in strict mode (zarr_fused, zarrs); a peer that rejects the
chain or reads other values than zarr's is named and not timed.

Peers: zarr's two pipelines, zarr_fused, zarr_fused with
``codec_pipeline.io_concurrency=1`` (its IO in the compute threads: the path
before the IO layer), zarrs and tensorstore. Each is checked to return the
written data before it is timed; rounds are interleaved (see
``side_by_side.py``) and the results are reported as ratios.

To model your own filesystem, measure its round trip (e.g. the median
``open`` + ``pread`` time of a small file with ``strace -T``, or
``ioping -c 20 DIR``) and pass it as ``--latency-us``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchmarks._latency import build_shim, drop_page_cache, shim_env
from side_by_side import rounds, table

BASELINE = "zarr_fused-io1"


#: the peers of this run (``--peers``); all by default
SELECTED: list[str] = []


def _peers() -> list[str]:
    from benchmarks._peers import PEERS, available

    names = [p for p in PEERS if available(p)]
    names.insert(names.index("zarr_fused") + 1, BASELINE)
    return [p for p in names if not SELECTED or p in SELECTED or p == "zarr_fused"]


class _Peer:
    """A reader or writer of one peer; the baseline is zarr_fused with
    ``codec_pipeline.io_concurrency`` = 1."""

    def __init__(self, inner: Any, baseline: bool) -> None:
        self.inner, self.baseline = inner, baseline

    def call(self, method: str, *args: Any) -> Any:
        import zarr

        fn = getattr(self.inner, method)
        if self.baseline:
            with zarr.config.set({"codec_pipeline.io_concurrency": 1}):
                return fn(*args)
        return fn(*args)


def _reader(peer: str, path: Path) -> _Peer:
    from benchmarks._peers import Reader

    return _Peer(Reader("zarr_fused" if peer == BASELINE else peer, path), peer == BASELINE)


def _writer(peer: str, layout: Any, path: Path) -> _Peer:
    from benchmarks._peers import Writer

    return _Peer(Writer("zarr_fused" if peer == BASELINE else peer, layout, path), peer == BASELINE)


def _summary(results: dict[str, dict[str, float]]) -> str:
    ours = results["zarr_fused"]["median"]
    return (
        "zarr_fused is "
        + ", ".join(
            f"{r['median'] / ours:.2f}x {p}" for p, r in results.items() if p != "zarr_fused"
        )
        + " (>1: zarr_fused faster)"
    )


def _flush(lines: list[str]) -> None:
    """Print ``lines`` now (a run takes minutes) and empty the list."""
    if lines:
        print("\n".join(lines), flush=True)
    lines.clear()


#: the read cases: (layout, selection or None for all, what), by name
def _read_cases(row: int) -> dict[str, tuple[str, Any, str]]:
    return {
        "unsharded-all": ("unsharded-blosc", Ellipsis, "read all"),
        "sharded-slab": ("sharded-zstd", (slice(row, row + 1),), f"thin slab a[{row}:{row + 1}]"),
        "sharded-all": ("sharded-zstd", Ellipsis, "read all"),
    }


READ_CASES = list(_read_cases(0))
#: the read cases of this run (``--cases``)
CASES: list[str] = []

#: the arrays of ``--chain``: (shape, chunks or shards, inner chunks when
#: sharded); 64 chunk files unsharded, 4 shards of 16 inner chunks
CHAIN_SHAPE = (1024, 1024)
CHAIN_UNSHARDED = ((128, 128), None)
CHAIN_SHARDED = ((512, 512), (128, 128))


def _chain_arrays(chains: list[str]) -> list[tuple[str, Path]]:
    """(what, path) of every array of ``chains``, each layout the chain
    comes in, written by zarr's Batched pipeline once (kept in the data
    directory, reused while complete)."""
    import shutil

    from benchmarks._peers import data_dir, pipeline
    from zarr.storage import LocalStore
    from zarr_fused_testing.chains import CHAINS, chain_values, create_chain_array, shardings

    out = []
    for name in chains:
        case = CHAINS[name]
        for sharded in shardings(case):
            layout = "sharded" if sharded else "unsharded"
            path = data_dir() / f"chain-{name}-{layout}"
            chunks, inner = CHAIN_SHARDED if sharded else CHAIN_UNSHARDED
            if not (path / ".complete").exists():
                shutil.rmtree(path, ignore_errors=True)
                with pipeline("zarr-batched"):
                    array = create_chain_array(LocalStore(path), case, CHAIN_SHAPE, chunks, inner)
                    array[:] = chain_values(case, CHAIN_SHAPE, 0)
                (path / ".complete").touch()
            out.append((f"{name} ({layout})", path))
    return out


class _ChainReader:
    """One peer's handle on a chain's array, opened once: zarr_fused and
    zarrs in strict mode (a fallback to zarr's code would time zarr)."""

    def __init__(self, peer: str, path: Path) -> None:
        from benchmarks._peers import PIPELINES, ts_driver

        self.peer = peer
        if peer == "tensorstore":
            import tensorstore as ts

            spec = {"driver": ts_driver(path), "kvstore": {"driver": "file", "path": str(path)}}
            self.handle = ts.open(spec).result()
            return
        import zarr
        from zarr.storage import LocalStore

        self.config: dict[str, Any] = {"codec_pipeline.path": PIPELINES[_base(peer)]}
        if _base(peer) in ("zarr_fused", "zarrs"):
            self.config["codec_pipeline.strict"] = True
        if peer == BASELINE:
            self.config["codec_pipeline.io_concurrency"] = 1
        with zarr.config.set(self.config):
            self.handle = zarr.open_array(LocalStore(path), mode="r")

    def read(self, selection: Any) -> Any:
        if self.peer == "tensorstore":
            return self.handle[selection].read().result()
        import zarr

        with zarr.config.set(self.config):
            return self.handle[selection]


def _base(peer: str) -> str:
    return "zarr_fused" if peer == BASELINE else peer


def _checked[H](
    peers: list[str], make: Callable[[str], H], result: Callable[[H], Any], what: str
) -> tuple[dict[str, H], list[str]]:
    """The handles (``make(peer)``) whose ``result`` is zarr's Batched one
    (the first peer), and a line for each other peer (not timed); exits
    when zarr_fused's is not among them. ``what``: "read" or "wrote"."""
    import numpy as np

    handles, skipped = {}, []
    expected = None
    for peer in peers:
        try:
            handle = make(peer)
            got = np.asarray(result(handle))
        except Exception as exc:
            skipped.append(f"{peer}: not timed: {type(exc).__name__}: {exc}"[:200])
            continue
        if expected is None:
            expected = got
        elif got.shape != expected.shape or not np.array_equal(
            got, expected, equal_nan=expected.dtype.kind in "fc"
        ):
            skipped.append(f"{peer}: not timed: {what} other values than zarr's")
            continue
        handles[peer] = handle
    if "zarr_fused" not in handles:
        raise SystemExit(f"zarr_fused's {what} failed: {skipped}")
    return handles, skipped


def _checked_readers(path: Path) -> tuple[dict[str, _ChainReader], list[str]]:
    """The peers that read zarr's values from ``path`` (see `_checked`)."""
    peers = ["zarr-batched", *(p for p in _peers() if p != "zarr-batched")]
    return _checked(
        peers, lambda peer: _ChainReader(peer, path), lambda r: r.read(Ellipsis), "read"
    )


def _cold_prepare(cold: bool) -> tuple[Callable[[], Any] | None, str]:
    """What runs before each timed read (the page cache dropped, for
    ``cold``), and a line saying why the cold scenario is skipped ("" if
    it is not)."""
    if not cold:
        return None, ""
    why = drop_page_cache()
    if why is not None:
        return None, f"## cold cache: skipped: {why}"
    return drop_page_cache, ""


class _ChainWriter:
    """One peer's writes of a whole chain array: ``prepare`` makes the
    array afresh (the shim delays its files too), ``write`` stores every
    chunk; zarr_fused and zarrs in strict mode."""

    def __init__(self, peer: str, case: dict[str, Any], sharded: bool, path: Path) -> None:
        from benchmarks._peers import PIPELINES

        self.case, self.sharded, self.path = case, sharded, path
        self.config: dict[str, Any] = {"codec_pipeline.path": PIPELINES[_base(peer)]}
        if _base(peer) in ("zarr_fused", "zarrs"):
            self.config["codec_pipeline.strict"] = True
        if peer == BASELINE:
            self.config["codec_pipeline.io_concurrency"] = 1
        self.array: Any = None

    def prepare(self) -> None:
        import shutil

        import zarr
        from zarr.storage import LocalStore
        from zarr_fused_testing.chains import create_chain_array

        shutil.rmtree(self.path, ignore_errors=True)
        chunks, inner = CHAIN_SHARDED if self.sharded else CHAIN_UNSHARDED
        with zarr.config.set(self.config):
            self.array = create_chain_array(
                LocalStore(self.path), self.case, CHAIN_SHAPE, chunks, inner
            )

    def write(self, value: Any) -> None:
        import zarr

        with zarr.config.set(self.config):
            self.array[...] = value

    def read_back(self) -> Any:
        """What zarr's own pipeline reads from the array written."""
        import zarr
        from benchmarks._peers import pipeline
        from zarr.storage import LocalStore

        with pipeline("zarr-batched"):
            return zarr.open_array(LocalStore(self.path), mode="r")[...]


def _checked_writers(
    case: dict[str, Any], sharded: bool, stem: str, value: Any
) -> tuple[dict[str, _ChainWriter], list[str]]:
    """The peers whose write of ``value`` zarr reads back as it reads its
    own (see `_checked`)."""
    from benchmarks._peers import data_dir

    def written(peer: str) -> _ChainWriter:
        writer = _ChainWriter(peer, case, sharded, data_dir() / f"{stem}-write-{peer}")
        writer.prepare()
        writer.write(value)
        return writer

    peers = ["zarr-batched", *(p for p in _peers() if p not in ("zarr-batched", "tensorstore"))]
    return _checked(peers, written, _ChainWriter.read_back, "wrote")


def chain_write_scenarios(repeat: int, chains: list[str]) -> list[str]:
    """Whole writes of the ``--chain`` arrays, every peer that writes them."""
    from zarr_fused_testing.chains import CHAINS, chain_values, shardings

    out: list[str] = []
    for name in chains:
        case = CHAINS[name]
        value = chain_values(case, CHAIN_SHAPE, 0)
        for sharded in shardings(case):
            layout = "sharded" if sharded else "unsharded"
            writers, skipped = _checked_writers(case, sharded, f"chain-{name}-{layout}", value)
            results = rounds(
                {p: ((lambda w=w, v=value: w.write(v)), w.prepare) for p, w in writers.items()},
                repeat,
            )
            out += table(f"write all: {name} ({layout})", results)
            out += [_summary(results), *skipped]
            _flush(out)
    return out


def chain_read_scenarios(repeat: int, cold: bool, chains: list[str]) -> list[str]:
    """Whole reads of the ``--chain`` arrays, every peer that reads them."""
    prepare, skipped_cold = _cold_prepare(cold)
    if skipped_cold:
        return [skipped_cold]
    out: list[str] = []
    for what, path in _chain_arrays(chains):
        readers, skipped = _checked_readers(path)
        results = rounds(
            {p: ((lambda r=r: r.read(Ellipsis)), prepare) for p, r in readers.items()}, repeat
        )
        out += table(f"read all: {what}{' (cold cache)' if cold else ''}", results)
        out += [_summary(results), *skipped]
        _flush(out)
    return out


def read_scenarios(repeat: int, cold: bool) -> list[str]:
    import numpy as np
    from benchmarks._peers import LAYOUTS, data_dir, write_reference

    prepare, skipped_cold = _cold_prepare(cold)
    if skipped_cold:
        return [skipped_cold]
    out: list[str] = []
    row = 100 % LAYOUTS["sharded-zstd"].shape[0]  # 100, or a row of the small scale
    cases = [c for name, c in _read_cases(row).items() if name in (CASES or READ_CASES)]
    for name, selection, what in cases:
        path = data_dir() / name
        data = write_reference(LAYOUTS[name], path)
        readers = {p: _reader(p, path) for p in _peers()}
        for p, reader in readers.items():
            if not np.array_equal(reader.call("read", selection), data[selection]):
                raise SystemExit(f"{p} read wrong data from {name} ({what})")
        results = rounds(
            {
                p: ((lambda r=r, s=selection: r.call("read", s)), prepare)
                for p, r in readers.items()
            },
            repeat,
        )
        out += table(f"{what}: {name}{' (cold cache)' if cold else ''}", results)
        out.append(_summary(results))
        _flush(out)
    return out


def write_scenarios(repeat: int) -> list[str]:
    import numpy as np
    from benchmarks._peers import LAYOUTS, data_dir

    out: list[str] = []
    for name in ("sharded-zstd", "sharded-raw", "unsharded-blosc"):
        layout = LAYOUTS[name]
        data = layout.sample()
        writers = {
            p: _writer(p, layout, data_dir() / f"latency-{name}-write-{p}") for p in _peers()
        }
        for p, writer in writers.items():
            writer.call("prepare")
            writer.call("write", data)
            if not np.array_equal(writer.call("read_back"), data):
                raise SystemExit(f"{p} wrote wrong data to {name}")
        results = rounds(
            {
                p: ((lambda w=w, d=data: w.call("write", d)), (lambda w=w: w.call("prepare")))
                for p, w in writers.items()
            },
            repeat,
        )
        out += table(f"write all: {name}", results)
        out.append(_summary(results))
        _flush(out)
    return out


def child(args: argparse.Namespace) -> int:
    if args.pin == "on":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cpus = sorted(os.sched_getaffinity(0))
    label = (
        "cold page cache"
        if args.cold
        else (f"{args.latency_us[0]} us per call" if args.latency_us[0] else "hot page cache")
    )
    _flush(
        [
            (
                f"# {label}, CPUs {cpus} ({'pinned' if args.pin == 'on' else 'unpinned'}), "
                f"{args.repeat} rounds"
            ),
            "# load average at the start: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()),
        ]
    )
    if args.chain:
        if "read" in args.ops:
            _flush(chain_read_scenarios(args.repeat, args.cold, args.chain))
        if "write" in args.ops and not args.cold:
            _flush(chain_write_scenarios(args.repeat, args.chain))
        return 0
    if "read" in args.ops:
        _flush(read_scenarios(args.repeat, args.cold))
    if "write" in args.ops and not args.cold:
        _flush(write_scenarios(args.repeat))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-us", type=int, nargs="+", default=[1000, 200])
    parser.add_argument(
        "--cold",
        action="store_true",
        help="drop the page cache before every timed read (no latency)",
    )
    parser.add_argument("--ops", nargs="+", choices=["read", "write"], default=["read", "write"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pin", choices=["off", "on", "both"], default="both")
    parser.add_argument(
        "--peers",
        nargs="+",
        default=[],
        help="peers to compare with zarr_fused (default: all); zarr's own "
        "pipelines take minutes per round at 1 ms",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=READ_CASES,
        default=[],
        help="read cases to run (default: all)",
    )
    parser.add_argument(
        "--chain",
        action="append",
        default=[],
        help="read and write (--ops) this chain of zarr_fused_testing.chains (repeatable) "
        "instead of the default arrays, unsharded and sharded",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    SELECTED[:] = args.peers
    CASES[:] = args.cases
    if args.child:
        return child(args)

    from benchmarks._peers import LAYOUTS, data_dir, write_reference

    if args.chain:  # written once, without the shim
        _chain_arrays(args.chain)
    else:
        for name in ("unsharded-blosc", "sharded-zstd"):
            write_reference(LAYOUTS[name], data_dir() / name)
    shim = None
    if any(args.latency_us) and not args.cold:
        shim = build_shim(data_dir().parent / "shim")
        if shim is None:
            print("latency scenarios skipped: the faultfs shim did not build (no C compiler?)")
            return 0
    pins = ["off", "on"] if args.pin == "both" else [args.pin]
    latencies = [0] if args.cold else args.latency_us
    for latency in latencies:
        for pin in pins:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTFS_")}
            env.pop("LD_PRELOAD", None)
            if latency and shim is not None:
                env = shim_env(shim, data_dir(), latency)
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--pin",
                pin,
                "--repeat",
                str(args.repeat),
                "--latency-us",
                str(latency),
                "--ops",
                *args.ops,
            ]
            if args.cold:
                cmd.append("--cold")
            if args.peers:
                cmd += ["--peers", *args.peers]
            if args.cases:
                cmd += ["--cases", *args.cases]
            for chain in args.chain:
                cmd += ["--chain", chain]
            sys.stdout.flush()
            res = subprocess.run(cmd, env=env, check=False)
            if res.returncode:
                return res.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
