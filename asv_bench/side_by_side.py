#!/usr/bin/env python
"""Side-by-side timings of zarr_fused and its peers, in one process.

Every peer runs the same operation on the same data in the same run, in
interleaved rounds (the order rotates each round), so a noisy machine slows
all of them alike; results are reported as ratios. Each result is checked
against the data before anything is timed.

    python asv_bench/side_by_side.py --scenario array-unsharded --pin both
    python asv_bench/side_by_side.py --scenario codecs --pin both

``--pin on`` restricts the process to CPU 0 first (like ``taskset -c 0``;
zarr_fused then sizes its pool to 1); ``--pin both`` runs unpinned, then
pinned, in two child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def rounds(
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any] | None]], repeat: int
) -> dict[str, dict[str, float]]:
    """Run every case ``repeat`` times, interleaved; ``prepare`` runs untimed
    before each timed call. Returns median/min wall and median CPU seconds."""
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, prepare = cases[name]
            if prepare is not None:
                prepare()
            w, c = _timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
    return {
        k: {
            "median": statistics.median(wall[k]),
            "min": min(wall[k]),
            "cpu": statistics.median(cpu[k]),
        }
        for k in cases
    }


def table(
    title: str,
    results: dict[str, dict[str, float]],
    ours: str = "zarr_fused",
    unit: tuple[str, float] | None = None,
) -> list[str]:
    lines = [f"## {title}"]
    head = f"{'peer':<16}{'median s':>10}{'min s':>10}{'cpu s':>9}"
    if unit:
        head += f"{unit[0]:>10}"
    head += f"{ours + ' speedup':>20}"
    lines.append(head)
    base = results[ours]["median"]
    for name, r in results.items():
        row = f"{name:<16}{r['median']:>10.4f}{r['min']:>10.4f}{r['cpu']:>9.3f}"
        if unit:
            row += f"{unit[1] / r['median'] / 1e9:>10.2f}"
        row += f"{r['median'] / base:>19.2f}x"
        lines.append(row)
    return lines


def _read_part(reader: Any, part: list[Any], pool: Any) -> None:
    """Read every selection of ``part``, inline or over ``pool``, dropping
    each result at once as a caller would."""
    if pool is None:
        for sel in part:
            reader.read(sel)
    else:
        for _ in pool.map(reader.read, part):
            pass


def sliced_rounds(
    readers: dict[str, Any],
    selections: list[Any],
    repeat: int,
    ours: str = "zarr_fused",
    size: int = 256,
    threads: int = 1,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Like `rounds` for many small reads: each round reads every selection
    once per peer, in slices of ``size`` reads with the peers interleaved
    slice by slice (order rotating), so that noise lasting a second or two
    hits every peer alike. With ``threads`` > 1, a slice's reads are spread
    over that many threads, as a threaded scheduler would issue them.
    Returns the per-round results, as `rounds` does, and for each other peer
    "k/n": in k of the n slices (over all rounds) ``ours`` took less time
    than that peer."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    names = list(readers)
    slices = [selections[i : i + size] for i in range(0, len(selections), size)]
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    per_slice: dict[str, list[float]] = {k: [] for k in names}
    turn = 0
    for _ in range(repeat):
        w_round = dict.fromkeys(names, 0.0)
        c_round = dict.fromkeys(names, 0.0)
        for part in slices:
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for name in order:
                w, c = _timed(partial(_read_part, readers[name], part, pool))
                w_round[name] += w
                c_round[name] += c
                per_slice[name].append(w)
        for name in names:
            wall[name].append(w_round[name])
            cpu[name].append(c_round[name])
    if pool is not None:
        pool.shutdown()
    results = {
        k: {
            "median": statistics.median(wall[k]),
            "min": min(wall[k]),
            "cpu": statistics.median(cpu[k]),
        }
        for k in names
    }
    won = {
        k: f"{sum(a < b for a, b in zip(per_slice[ours], per_slice[k]))}/{len(per_slice[k])}"
        for k in names
        if k != ours
    }
    return results, won


# -- scenarios ------------------------------------------------------------------------------


def _small_reads(name: str, store_kind: str) -> tuple[Any, dict[str, Any], list[Any]]:
    """The data of layout ``name``, a reader per peer (zarr's default
    pipeline left out) and one selection per inner chunk, in order."""
    import numpy as np

    sys.path.insert(0, str(HERE))
    from benchmarks._peers import LAYOUTS, PEERS, Reader, available, data_dir, write_reference

    layout = LAYOUTS[name]
    path = data_dir() / name
    data = write_reference(layout, path)
    readers = {
        p: Reader(p, path, store_kind) for p in PEERS if available(p) and p != "zarr-batched"
    }
    inner = layout.chunks
    blocks = [
        tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, inner))
        for idx in np.ndindex(*(s // c for s, c in zip(layout.shape, inner)))
    ]
    return data, readers, blocks


def scenario_patterns(layout_names: list[str], repeat: int, store_kind: str = "local") -> list[str]:
    """Small reads: every inner chunk one call at a time, and a thin slab."""
    import numpy as np

    out: list[str] = []
    for name in layout_names:
        data, readers, blocks = _small_reads(name, store_kind)
        for p, reader in readers.items():
            for sel in (blocks[0], blocks[-1], (slice(100, 101),)):
                if not np.array_equal(reader.read(sel), data[sel]):
                    raise SystemExit(f"{p} read wrong data from {name}")

        results, won = sliced_rounds(readers, blocks, max(1, repeat // 2))
        out += table(f"{len(blocks)} reads of one inner chunk each: {name} ({store_kind})", results)
        out.append(
            "per call (us): "
            + ", ".join(f"{p} {r['median'] / len(blocks) * 1e6:.0f}" for p, r in results.items())
        )
        out.append(
            "slices of 256 calls where zarr_fused was faster: "
            + ", ".join(f"than {p} {w}" for p, w in won.items())
        )
        results = rounds(
            {p: ((lambda r=r: r.read((slice(100, 101),))), None) for p, r in readers.items()},
            repeat,
        )
        out += table(f"thin slab a[100:101]: {name} ({store_kind})", results)
    return out


def scenario_threads(
    layout_names: list[str], repeat: int, store_kind: str = "local", threads: int = 4
) -> list[str]:
    """Small reads from several threads at once: every inner chunk, one call
    each, spread over ``threads`` threads (a threaded Dask worker reading
    small pieces). All zarr-python peers share zarr's one event loop and the
    GIL here, so this measures how much of each call holds them."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    out: list[str] = []
    for name in layout_names:
        data, readers, blocks = _small_reads(name, store_kind)
        with ThreadPoolExecutor(threads) as pool:
            for p, reader in readers.items():
                picks = blocks[:: max(1, len(blocks) // 64)]
                for sel, got in zip(picks, pool.map(reader.read, picks)):
                    if not np.array_equal(got, data[sel]):
                        raise SystemExit(f"{p} read wrong data from {name} from {threads} threads")
        results, won = sliced_rounds(readers, blocks, max(1, repeat // 2), threads=threads)
        out += table(
            f"{len(blocks)} reads of one inner chunk each from {threads} threads: "
            f"{name} ({store_kind})",
            results,
        )
        out.append(
            "per read, wall time / reads (us): "
            + ", ".join(f"{p} {r['median'] / len(blocks) * 1e6:.0f}" for p, r in results.items())
        )
        out.append(
            "slices of 256 reads where zarr_fused was faster: "
            + ", ".join(f"than {p} {w}" for p, w in won.items())
        )
    return out


def scenario_arrays(layout_names: list[str], repeat: int, store_kind: str = "local") -> list[str]:
    import numpy as np

    sys.path.insert(0, str(HERE))
    from benchmarks._peers import (
        LAYOUTS,
        PEERS,
        Reader,
        Writer,
        available,
        data_dir,
        write_reference,
    )

    out: list[str] = []
    peers = [p for p in PEERS if available(p)]
    for name in layout_names:
        layout = LAYOUTS[name]
        path = data_dir() / name
        data = write_reference(layout, path)
        nbytes = data.nbytes
        readers = {p: Reader(p, path, store_kind) for p in peers}
        for p, reader in list(readers.items()):
            try:
                got = reader.read()
            except Exception as error:  # a peer that cannot read this layout at all
                out.append(f"{p} left out of read all: {name}: {type(error).__name__}: {error}")
                del readers[p]
                continue
            if not np.array_equal(got, data):
                raise SystemExit(f"{p} read wrong data from {name}")
        results = rounds({p: (r.read, None) for p, r in readers.items()}, repeat)
        out += table(
            f"read all: {name} ({store_kind}, {nbytes / 2**20:.0f} MiB)",
            results,
            unit=("GB/s", nbytes),
        )
        writers = {
            p: Writer(p, layout, data_dir() / f"{name}-write-{p}", store_kind) for p in peers
        }
        for p, writer in list(writers.items()):
            writer.prepare()
            try:
                writer.write(data)
            except Exception as error:
                out.append(f"{p} left out of write all: {name}: {type(error).__name__}: {error}")
                del writers[p]
                continue
            if not np.array_equal(writer.read_back(), data):
                raise SystemExit(f"{p} wrote wrong data to {name}")
        results = rounds(
            {p: (partial(w.write, data), w.prepare) for p, w in writers.items()}, repeat
        )
        out += table(
            f"write all: {name} ({store_kind}, {nbytes / 2**20:.0f} MiB)",
            results,
            unit=("GB/s", nbytes),
        )
    return out


def _plain_rename(write: Callable[[Any], None], data: Any) -> None:
    from zarr_fused._localio import replace_mode

    before = replace_mode("rename")
    try:
        write(data)
    finally:
        replace_mode(before)


def scenario_overwrite(
    layout_names: list[str], repeat: int, store_kind: str = "local"
) -> list[str]:
    """Whole writes over an array already written and on disk: before every
    timed write each peer opens a new handle and ``os.sync()`` writes the
    page cache back, so every write replaces chunk files whose blocks are
    allocated (what a rename over them then frees differs from a write
    right after the last one, whose blocks were still delayed)."""
    import numpy as np

    sys.path.insert(0, str(HERE))
    from benchmarks._peers import LAYOUTS, PEERS, Writer, available, data_dir

    if store_kind != "local":
        raise SystemExit("the overwrite scenario needs --store local")
    out: list[str] = []
    for name in layout_names:
        layout = LAYOUTS[name]
        data = layout.sample()
        writers = {
            p: Writer(p, layout, data_dir() / f"{name}-overwrite-{p}", store_kind)
            for p in PEERS
            if available(p)
        }
        for p, writer in list(writers.items()):
            writer.prepare()
            try:
                writer.write(data)  # the chunks the timed writes replace
                writer.reopen()
                writer.write(data)
            except Exception as error:
                out.append(f"{p} left out of overwrite: {name}: {type(error).__name__}: {error}")
                del writers[p]
                continue
            if not np.array_equal(writer.read_back(), data):
                raise SystemExit(f"{p} wrote wrong data to {name}")
        cases = {p: (partial(w.write, data), w.reopen) for p, w in writers.items()}
        if "zarr_fused" in writers:
            # the same writer replacing every chunk with a plain rename (the
            # way before exchange + unlink), for the ratio in the same run
            w = writers["zarr_fused"]
            cases["zarr_fused rename"] = (partial(_plain_rename, w.write, data), w.reopen)
        results = rounds(cases, repeat)
        out += table(
            f"overwrite after os.sync(): {name} ({store_kind}, {data.nbytes / 2**20:.0f} MiB)",
            results,
            unit=("GB/s", data.nbytes),
        )
    return out


def _codec_tables(
    label: str, nc: Any, params: dict[str, Any], data: Any, raw: list[bytes], repeat: int
) -> list[str]:
    """Decode and encode tables of one codec configuration: the native batch
    kernels against numcodecs, inline and on two threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from zarr_fused import _codec_batch as kb
    from zarr_fused import _codecs as kc

    n_chunks = len(raw)
    chunk_bytes = len(raw[0])
    items = chunk_bytes // 4
    out: list[str] = []
    kernel = kc.ChainKernel(itemsize=4, **params)
    payloads = [nc.encode(r) for r in raw]
    assert all(bytes(kernel.decode(p, chunk_bytes)) == r for p, r in zip(payloads, raw))
    dest = np.empty(n_chunks * items, dtype="<f4")
    layout = kb.ChunkLayout((items,), 4, None)
    # encoded chunks go to a reused buffer, as the sharded writer does
    bound = kernel.max_encoded_size(chunk_bytes)
    arena = np.empty(n_chunks * bound, dtype=np.uint8)

    def native_decode(lo: int, hi: int) -> None:
        batch = kb.DecodeBatch(kernel, hi - lo, 1)
        for i in range(lo, hi):
            batch.add(payloads[i], layout, (), dest, (slice(i * items, (i + 1) * items),), (), i)
        batch.run()

    def native_encode(lo: int, hi: int) -> list[Any]:
        batch = kb.EncodeBatch(kernel, hi - lo, 1, repr, arena[lo * bound : hi * bound])
        for i in range(lo, hi):
            batch.add(data[i * items : (i + 1) * items], layout, False, i)
        return batch.run()

    # what the native encoder produces decodes (with numcodecs) to the data
    if [bytes(nc.decode(bytes(p))) for p in native_encode(0, n_chunks)] != raw:
        raise SystemExit(f"native {label} encode is wrong")

    def numcodecs_decode(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            nc.decode(payloads[i], out=dest[i * items : (i + 1) * items])

    def numcodecs_encode(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            nc.encode(raw[i])

    pool = ThreadPoolExecutor(2)

    def on(threads: int, fn: Callable[[int, int], None]) -> Callable[[], None]:
        if threads == 1:
            return lambda: fn(0, n_chunks)
        half = n_chunks // 2
        return lambda: list(pool.map(lambda lh: fn(*lh), [(0, half), (half, n_chunks)]))

    for op, (ours, theirs) in {
        "decode": (native_decode, numcodecs_decode),
        "encode": (native_encode, numcodecs_encode),
    }.items():
        cases = {}
        for threads in (1, 2):
            cases[f"numcodecs/{threads}t"] = (on(threads, theirs), None)
            cases[f"native/{threads}t"] = (on(threads, ours), None)
        results = rounds(cases, repeat)
        out += table(
            f"{op} {n_chunks} x 64 KiB float32, {label}",
            results,
            ours="native/1t",
            unit=("GB/s", n_chunks * chunk_bytes),
        )
    pool.shutdown()
    return out


def scenario_codecs(repeat: int) -> list[str]:
    """Native batch kernels against numcodecs on the same payloads."""
    import numcodecs
    import numcodecs.blosc
    import numpy as np

    from zarr_fused import _codecs as kc

    numcodecs.blosc.use_threads = False  # as zarr sets it

    rng = np.random.default_rng(0)
    n_chunks, chunk_bytes = 256, 64 * 1024
    items = chunk_bytes // 4
    x = np.linspace(0, 50, n_chunks * items)
    data = (np.sin(x) * 1000 + rng.normal(0, 1, x.size)).astype("<f4")
    raw = [data[i * items : (i + 1) * items].tobytes() for i in range(n_chunks)]
    out: list[str] = []
    configs = {
        "zstd-1": (numcodecs.Zstd(level=1), {"compressor": "zstd", "level": 1}),
        "blosc-lz4-shuffle": (
            numcodecs.Blosc("lz4", 5, 1, typesize=4),
            {
                "compressor": "blosc",
                "cname": "lz4",
                "clevel": 5,
                "shuffle": "shuffle",
                "typesize": 4,
            },
        ),
        "gzip-1": (numcodecs.GZip(1), {"compressor": "gzip", "level": 1}),
    }
    for label, (nc, params) in configs.items():
        out += _codec_tables(label, nc, params, data, raw, repeat)
    # crc32c alone: 4 MiB 25 times per round (one call takes a fraction of a
    # millisecond, too short to time alone on a noisy machine)
    blob = rng.bytes(4 * 2**20)
    import google_crc32c

    if kc.crc32c(blob) != google_crc32c.value(blob) or kc.crc32c(blob, portable=True) != kc.crc32c(
        blob
    ):
        raise SystemExit("crc32c implementations disagree")
    calls = 25

    def repeated(fn: Callable[[], Any]) -> Callable[[], None]:
        return lambda: [fn() for _ in range(calls)] and None

    results = rounds(
        {
            "google_crc32c": (repeated(lambda: google_crc32c.value(blob)), None),
            "native": (repeated(lambda: kc.crc32c(blob)), None),
            "native-portable": (repeated(lambda: kc.crc32c(blob, portable=True)), None),
        },
        repeat,
    )
    out += table(
        f"crc32c of 4 MiB, {calls} calls ({kc.crc32c_implementation()})",
        results,
        ours="native",
        unit=("GB/s", calls * len(blob)),
    )
    return out


def scenario_ceiling(repeat: int) -> list[str]:
    """zarr_fused's whole read of the sharded zstd array against decoding the
    same inner-chunk payloads with libzstd alone (the same library it
    links), one thread: how close the read path gets to the codec."""
    import numpy as np
    import zarr

    sys.path.insert(0, str(HERE))
    from benchmarks._peers import LAYOUTS, Reader, data_dir, write_reference

    from zarr_fused import _codecs as kc
    from zarr_fused import _shard_index

    name = "sharded-zstd"
    layout = LAYOUTS[name]
    path = data_dir() / name
    data = write_reference(layout, path)
    grid = tuple(s // c for s, c in zip(layout.shards, layout.chunks))
    n = int(np.prod(grid))
    payloads = []
    for key in sorted(p for p in (path / "c").rglob("*") if p.is_file()):
        shard = key.read_bytes()
        entries = _shard_index.parse_index(
            shard[-(16 * n + 4) :], n, checksum=True, big_endian=False
        )
        payloads += [shard[int(o) : int(o + s)] for o, s in entries]
    nbytes = int(np.prod(layout.chunks)) * 2
    kernel = kc.ChainKernel(compressor="zstd", itemsize=2)
    # libzstd decoding every payload into its own place in one big output
    # (written before, so its pages are mapped), as a decoder that keeps
    # what it decodes must: the decoded bytes go to memory, not to cache.
    target = np.zeros(len(payloads) * nbytes, np.uint8)

    def libzstd_only(into: np.ndarray | None = None) -> None:
        # ``into`` None: the prefaulted target; else a fresh output, whose
        # pages the kernel must zero on first touch, as a reader's must
        dest = target if into is None else into
        for i, p in enumerate(payloads):
            kernel.decode(p, nbytes, out=dest[i * nbytes : (i + 1) * nbytes])

    reader = Reader("zarr_fused", path)
    if not np.array_equal(reader.read(), data):
        raise SystemExit("zarr_fused read wrong data")
    with zarr.config.set({"codec_pipeline.max_workers": 1}):
        results = rounds(
            {
                "libzstd-only": (libzstd_only, None),
                "libzstd-fresh": (lambda: libzstd_only(np.empty_like(target)), None),
                "zarr_fused": (reader.read, None),
            },
            repeat,
        )
    lines = table(
        f"single thread: read all of {name} vs decoding its {len(payloads)} payloads",
        results,
        unit=("GB/s", data.nbytes),
    )
    ours = results["zarr_fused"]["median"]
    lines.append(
        f"zarr_fused reaches {results['libzstd-only']['median'] / ours:.0%} of libzstd's "
        "single-thread decode throughput into a prefaulted buffer, "
        f"{results['libzstd-fresh']['median'] / ours:.0%} into a fresh one "
        "(like the output array zarr allocates for every read)"
    )
    return lines


SCENARIOS = {
    "array-unsharded": lambda repeat, store: scenario_arrays(
        ["unsharded-blosc", "unsharded-zstd"], repeat, store
    ),
    "array-sharded": lambda repeat, store: scenario_arrays(
        ["sharded-zstd", "sharded-raw"], repeat, store
    ),
    "array-sharded-crc": lambda repeat, store: scenario_arrays(["sharded-zstd-crc"], repeat, store),
    "sharded-patterns": lambda repeat, store: scenario_patterns(["sharded-zstd"], repeat, store),
    "sharded-threads": lambda repeat, store: scenario_threads(["sharded-zstd"], repeat, store),
    "array-v2": lambda repeat, store: scenario_arrays(
        ["v2-blosc", "v2-zstd", "v2-blosc-F"], repeat, store
    ),
    "overwrite-unsharded": lambda repeat, store: scenario_overwrite(
        ["unsharded-blosc"], repeat, store
    ),
    "overwrite-sharded": lambda repeat, store: scenario_overwrite(
        ["sharded-zstd", "sharded-raw"], repeat, store
    ),
    "codecs": lambda repeat, store: scenario_codecs(repeat),
    "zstd-ceiling": lambda repeat, store: scenario_ceiling(repeat),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="array-unsharded")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", choices=["local", "memory"], default="local")
    parser.add_argument("--pin", choices=["off", "on", "both"], default="off")
    parser.add_argument("--json", help="also write the report lines to this file")
    args = parser.parse_args(argv)
    if args.pin == "both":
        lines: list[str] = []
        for pin in ("off", "on"):
            cmd = [
                sys.executable,
                __file__,
                "--scenario",
                args.scenario,
                "--repeat",
                str(args.repeat),
                "--store",
                args.store,
                "--pin",
                pin,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode:
                sys.stderr.write(res.stderr)
                return res.returncode
            lines += res.stdout.splitlines()
        print("\n".join(lines))
        return 0
    if args.pin == "on":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cpus = sorted(os.sched_getaffinity(0))
    header = [
        (
            f"# scenario {args.scenario}, store {args.store}, CPUs {cpus} "
            f"({'pinned' if args.pin == 'on' else 'unpinned'}), {args.repeat} rounds"
        )
    ]
    lines = header + SCENARIOS[args.scenario](args.repeat, args.store)
    print("\n".join(lines), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
