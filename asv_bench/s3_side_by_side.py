#!/usr/bin/env python
"""Side-by-side timings on S3 (issue 15): moto's S3 server on 127.0.0.1
behind a proxy that adds a fixed latency per request and counts requests and
bytes, for zarr_fused, zarr's two pipelines, zarrs and tensorstore.

    python asv_bench/s3_side_by_side.py                      # 0 and 20 ms, every scenario
    python asv_bench/s3_side_by_side.py --latency 20 --scenario sharded --repeat 5
    python asv_bench/s3_side_by_side.py --json run.json
    python asv_bench/s3_side_by_side.py --scenario sharded --operation slab --max-gap 0 \
        --max-gap 65536 --max-gap 1048576                  # the coalescing cost model
    python asv_bench/s3_side_by_side.py --latency 20 --scenario unsharded \
        --fused-concurrency 10 --fused-concurrency 32 --fused-concurrency 64
    python asv_bench/s3_side_by_side.py --store s3fs --latency 20 --operation write-all \
        --bare-concurrency 10 --bare-concurrency 64        # what the store alone needs
    python asv_bench/s3_side_by_side.py --server static --server-cpu 1 --latency 20 \
        --scenario unsharded --operation whole          # reads from the light server
    python asv_bench/s3_side_by_side.py --server static --server-cpu 1 --latency 20 \
        --operation write-all --peer zarr_fused --peer zarr-fused --peer zarr-batched \
        --peer bare-puts --repeat 5                     # writes to it
    python asv_bench/s3_side_by_side.py --chain gzip-f4 --chain v2-delta-i4-blosc \
        --latency 20 --repeat 5                         # chains of the catalogue

zarr_fused and zarr's pipelines read through zarr's ``ObjectStore`` over
obstore's ``S3Store`` (``--store s3fs``: ``FsspecStore`` over s3fs); zarrs
through the same ``ObjectStore`` (its native object_store path; a fallback to
zarr's Python pipeline is refused with ``codec_pipeline.strict``);
tensorstore through its own ``s3`` kvstore with an ``endpoint`` override and
credentials from the environment. Every peer reads the one array zarr's
Batched pipeline wrote, and writes its own copy.

``bare-puts`` is the floor of a whole write: the objects zarr's Batched
pipeline wrote, PUT again through the same zarr store with no encode and no
pipeline, ``--bare-concurrency`` at a time (default 10, zarr's). What a
pipeline takes above it is its own; when every pipeline sits on it, the
store (the client library's cost per request, the server) sets the pace.

Each peer's values are checked before anything is timed (reads against the
data, writes read back by zarr's Batched pipeline). Timed calls run in
interleaved rounds, the order rotating each round; the requests and bytes of
each peer are those of its last timed call (they do not vary between calls).
Without added latency moto itself (a few ms per request) dominates: compare
peers at 20 ms, and only as ratios measured in one run.

``--chain NAME`` (repeatable) replaces the scenarios with chains of the
real-data catalogue (`zarr_fused_testing.chains`), each unsharded and (format
3) sharded, read whole; zarr_fused runs in strict mode there (a chain it
cannot read natively fails instead of timing zarr's code), and every peer's
values are checked against zarr's Batched pipeline's read of the same
values.

``--server static`` serves reads and writes from
`zarr_fused_testing.s3_static.StaticS3Server` instead: a light S3 server (one asyncio
process, no signature checks) that adds the latency itself, over a local
directory (the same keys; the arrays every peer reads written there by zarr's
Batched pipeline, a write's array created and checked there, untimed). Then
the client, not moto, sets the pace: moto spends a few ms of CPU per PUT.
``--server-cpu N`` pins the static server to CPU N (``taskset`` on the whole
script pins it with the client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools as it
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
from zarr_fused_testing.s3 import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    LatencyProxy,
    MotoServer,
    ServerUnavailable,
    Stats,
    obstore_s3,
)
from zarr_fused_testing.s3_static import StaticS3Server

BUCKET = "zarr-fused-bench"
PIPELINES = {
    "zarr_fused": "zarr_fused.FusedCodecPipeline",
    "zarr-fused": "zarr.core.codec_pipeline.FusedCodecPipeline",
    "zarr-batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "zarrs": "zarrs.ZarrsCodecPipeline",
}
#: not a peer but the floor of a write: the objects zarr's Batched pipeline
#: wrote, PUT again through the same store with nothing else to do (no
#: encode), ``BARE_CONCURRENCY`` at a time ("bare-puts@N": N at a time)
BARE = "bare-puts"
BARE_CONCURRENCY = 10  # zarr's async.concurrency default
PEERS = [*PIPELINES, "tensorstore", BARE]
# "zarr_fused@N": zarr_fused with ``codec_pipeline.async_concurrency`` = N
# (--fused-concurrency); the bare name runs with its default
VARIANT = "@"
WRITER = "zarr-batched"  # writes the arrays every peer reads


# -- scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteAt:
    """An operation that writes the scenario's data at ``selection`` (an
    update of part of the stored objects: a shard read, merged, rewritten)."""

    selection: Any


@dataclass(frozen=True)
class Scenario:
    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]  # the stored objects: shards when sharded
    inner: tuple[int, ...] | None
    operations: dict[str, Any]  # name -> a selection, "write" (all) or a `WriteAt`

    def data(self) -> np.ndarray:
        """Smooth data with noise (compresses like measurements)."""
        rng = np.random.default_rng(1234)
        grids = np.meshgrid(
            *(np.linspace(0, 8, s, dtype="f4") for s in self.shape), indexing="ij", sparse=True
        )
        values = sum(np.sin(g * (i + 1)) for i, g in enumerate(grids))
        if np.dtype(self.dtype).kind == "f":
            return (values + rng.normal(0, 0.05, self.shape).astype("f4")).astype(self.dtype)
        scaled = (values - values.min()) / (np.ptp(values) or 1) * 4000
        return (scaled + rng.integers(0, 16, self.shape)).astype(self.dtype)

    def create(self, store: Any) -> Any:
        import zarr

        return zarr.create_array(
            store,
            shape=self.shape,
            dtype=self.dtype,
            chunks=self.inner or self.chunks,
            shards=self.chunks if self.inner else None,
            compressors=zarr.codecs.ZstdCodec(level=1),
            fill_value=0,
            overwrite=True,
        )


@dataclass(frozen=True)
class ChainScenario:
    """A chain of `zarr_fused_testing.chains` as a read scenario: its array
    (``chunks`` the shards when ``inner`` is given), read whole."""

    name: str
    chain: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    inner: tuple[int, ...] | None
    operations: dict[str, Any] = field(default_factory=lambda: {"whole": Ellipsis})

    def data(self) -> np.ndarray:
        from zarr_fused_testing.chains import CHAINS, chain_values

        return chain_values(CHAINS[self.chain], self.shape, 0)

    def expected(self) -> np.ndarray:
        """What zarr's Batched pipeline reads back of `data` (a lossy
        filter's values, not the ones written)."""
        import zarr
        from zarr.storage import MemoryStore

        with zarr.config.set(zarr_config(WRITER)):
            array = self.create(MemoryStore())
            array[...] = self.data()
            return np.asarray(array[...])

    def create(self, store: Any) -> Any:
        from zarr_fused_testing.chains import CHAINS, create_chain_array

        return create_chain_array(store, CHAINS[self.chain], self.shape, self.chunks, self.inner)


#: the arrays of ``--chain``: 64 objects unsharded, 4 shards of 16 inner chunks
CHAIN_SHAPE = (1024, 1024)
CHAIN_UNSHARDED = ((128, 128), None)
CHAIN_SHARDED = ((512, 512), (128, 128))


def chain_scenarios(chains: list[str]) -> dict[str, ChainScenario]:
    """The scenarios of ``--chain``: each chain in each layout it comes in."""
    from zarr_fused_testing.chains import CHAINS, shardings

    out = {}
    for chain in chains:
        for sharded in shardings(CHAINS[chain]):
            name = f"{chain}-{'sharded' if sharded else 'unsharded'}"
            chunks, inner = CHAIN_SHARDED if sharded else CHAIN_UNSHARDED
            out[name] = ChainScenario(name, chain, CHAIN_SHAPE, chunks, inner)
    return out


#: zarr_fused in strict mode (``--chain``: a fallback would time zarr's code)
STRICT_OURS: list[bool] = []


SCENARIOS: dict[str, Scenario | ChainScenario] = {
    "sharded": Scenario(
        "sharded",
        (256, 256, 256),
        "uint16",
        (128, 128, 128),
        (32, 32, 32),
        {
            "whole": Ellipsis,
            "one-inner": (slice(0, 32),) * 3,
            "slab": (slice(100, 101), slice(None), slice(None)),
            "write-all": "write",
            # one plane of every shard in its first row: 4 shards read and rewritten
            "write-slab": WriteAt((slice(100, 101), slice(None), slice(None))),
        },
    ),
    "unsharded": Scenario(
        "unsharded",
        (2048, 2048),
        "float32",
        (64, 64),
        None,
        {"whole": Ellipsis, "write-all": "write"},
    ),
}


# -- peers -------------------------------------------------------------------------------


def zarr_store(kind: str, endpoint: str, prefix: str) -> Any:
    from zarr.storage import FsspecStore, ObjectStore

    if kind == "obstore":
        return ObjectStore(
            obstore_s3(
                BUCKET,
                endpoint,
                prefix,
                # a failing peer fails in seconds, not after 3 minutes
                retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=20)},
            )
        )
    import s3fs

    fs = s3fs.S3FileSystem(
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        asynchronous=True,
        client_kwargs={"endpoint_url": endpoint, "region_name": REGION},
    )
    return FsspecStore(fs, path=f"{BUCKET}/{prefix}")


def tensorstore_spec(endpoint: str, prefix: str) -> dict[str, Any]:
    return {
        "driver": "zarr3",
        "kvstore": {
            "driver": "s3",
            "bucket": BUCKET,
            "path": prefix + "/",
            "endpoint": endpoint,
            "aws_region": REGION,
            "aws_credentials": {"type": "environment"},
        },
    }


def zarr_config(peer: str) -> dict[str, Any]:
    base, _, limit = peer.partition(VARIANT)
    if base == BARE:
        base, limit = WRITER, ""
    cfg: dict[str, Any] = {"codec_pipeline.path": PIPELINES[base]}
    if limit:
        cfg["codec_pipeline.async_concurrency"] = int(limit)
    if peer == "zarrs" or (base == "zarr_fused" and STRICT_OURS):
        cfg["codec_pipeline.strict"] = True  # no silent fallback to zarr's pipeline
    return cfg


class BarePuts:
    """The time the store alone needs for a write: the objects of the array
    as zarr's Batched pipeline wrote them, taken once (untimed), then PUT
    again through the same zarr store (``FsspecStore.set``,
    ``ObjectStore.set``), ``limit`` at a time. No encode, no pipeline: what
    is left is the client library's cost per request and the server's."""

    def __init__(self, store: Any, limit: int) -> None:
        self.store, self.limit = store, limit
        self.objects: dict[str, Any] = {}

    def open(self, data: np.ndarray) -> None:
        import zarr
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        with zarr.config.set(zarr_config(WRITER)):
            zarr.open_array(self.store, mode="r+")[...] = data

        async def snapshot() -> dict[str, Any]:
            keys = [k async for k in self.store.list() if not k.endswith("zarr.json")]
            proto = default_buffer_prototype()
            values = await asyncio.gather(*(self.store.get(k, prototype=proto) for k in keys))
            return dict(zip(keys, values, strict=True))

        self.objects = sync(snapshot())

    def write(self) -> None:
        from zarr.core.sync import sync

        slots = asyncio.Semaphore(self.limit)

        async def put(key: str, value: Any) -> None:
            async with slots:
                await self.store.set(key, value)

        async def put_all() -> None:
            await asyncio.gather(*(put(k, v) for k, v in self.objects.items()))

        sync(put_all())


class Peer:
    """One peer's handle on one array: ``prepare`` (untimed) opens it,
    ``run`` does the operation."""

    def __init__(self, peer: str, store_kind: str, endpoint: str, prefix: str) -> None:
        self.peer, self.store_kind, self.endpoint, self.prefix = peer, store_kind, endpoint, prefix
        self.handle: Any = None

    def open(self, *, write: bool = False, data: np.ndarray | None = None) -> None:
        base, _, limit = self.peer.partition(VARIANT)
        if base == BARE:
            if not write or data is None:
                raise NotImplementedError(f"{BARE} times whole writes only")
            store = zarr_store(self.store_kind, self.endpoint, self.prefix)
            self.handle = BarePuts(store, int(limit or BARE_CONCURRENCY))
            self.handle.open(data)
            return
        if self.peer == "tensorstore":
            import tensorstore as ts

            self.handle = ts.open(
                tensorstore_spec(self.endpoint, self.prefix), read=True, write=write
            ).result()
            return
        import zarr

        with zarr.config.set(zarr_config(self.peer)):
            self.handle = zarr.open_array(
                zarr_store(self.store_kind, self.endpoint, self.prefix), mode="r+" if write else "r"
            )
        if (
            self.peer == "zarrs"
            and getattr(self.handle._async_array.codec_pipeline, "impl", None) is None
        ):
            raise RuntimeError("zarrs did not take this array (no native implementation)")

    def read(self, selection: Any) -> np.ndarray:
        if self.peer == "tensorstore":
            return np.asarray(self.handle[selection].read().result())
        import zarr

        with zarr.config.set(zarr_config(self.peer)):
            return np.asarray(self.handle[selection])

    def write(self, data: np.ndarray, selection: Any = Ellipsis) -> None:
        if isinstance(self.handle, BarePuts):
            self.handle.write()
            return
        if self.peer == "tensorstore":
            self.handle[selection].write(data).result()
            return
        import zarr

        with zarr.config.set(zarr_config(self.peer)):
            self.handle[selection] = data


def available(peer: str) -> str | None:
    """None, or why ``peer`` cannot run here."""
    module = {"zarrs": "zarrs", "tensorstore": "tensorstore"}.get(peer)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError as exc:
        return str(exc)
    return None


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Result:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # this process' CPU, every thread
    stats: Stats | None = None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        s = self.stats
        return {
            "median_s": statistics.median(self.wall) if self.wall else None,
            "min_s": min(self.wall) if self.wall else None,
            "cpu_s": statistics.median(self.cpu) if self.cpu else None,
            "requests": dict(s.requests) if s else {},
            "bytes_received": sum(s.bytes_received.values()) if s else 0,
            "bytes_sent": sum(s.bytes_sent.values()) if s else 0,
            "max_in_flight": s.max_in_flight if s else 0,
            "error": self.error,
        }


def measure(
    scenario: Scenario | ChainScenario,
    operation: str,
    peers: list[str],
    proxy: LatencyProxy | StaticS3Server,
    direct: Callable[[str], Any],
    store_kind: str,
    source: str,
    repeat: int,
) -> dict[str, Result]:
    selection = scenario.operations[operation]
    data = scenario.data()
    writing = selection == "write" or isinstance(selection, WriteAt)
    where = selection.selection if isinstance(selection, WriteAt) else Ellipsis
    if writing:
        expected = None
    elif isinstance(scenario, ChainScenario):
        expected = scenario.expected()[selection]
    else:
        expected = data[selection]
    if where is not Ellipsis or not writing:  # the floor is that of whole writes
        peers = [p for p in peers if p.partition(VARIANT)[0] != BARE]
    results = {p: Result() for p in peers}
    handles: dict[str, Peer] = {}
    for peer in peers:
        try:
            if writing:
                prefix = f"{source}-{operation}-{peer}"
                arr = scenario.create(direct(prefix))
                if where is not Ellipsis:  # a partial update of stored shards
                    import zarr

                    with zarr.config.set(zarr_config(WRITER)):
                        arr[...] = data
                handle = Peer(peer, store_kind, proxy.endpoint, prefix)
                handle.open(write=True, data=data if where is Ellipsis else None)
                handle.write(data[where], where)  # the check: read back by zarr's pipeline
                import zarr

                with zarr.config.set(zarr_config(WRITER)):
                    if not np.array_equal(zarr.open_array(direct(prefix), mode="r")[...], data):
                        raise AssertionError("wrong values written")
            else:
                handle = Peer(peer, store_kind, proxy.endpoint, source)
                handle.open()
                got = handle.read(selection)
                if got.dtype != expected.dtype or not np.array_equal(
                    got, expected, equal_nan=expected.dtype.kind in "fc"
                ):
                    raise AssertionError("wrong values read")
            handles[peer] = handle
        except Exception as exc:
            results[peer].error = f"{type(exc).__name__}: {exc}"[:200]
            print(f"{peer}: {type(exc).__name__}: {exc}"[:3000], file=sys.stderr)
    names = list(handles)
    for r in range(repeat):
        for peer in names[r % len(names) :] + names[: r % len(names)]:
            handle = handles[peer]
            proxy.reset()
            c0, t0 = time.process_time(), time.perf_counter()
            if writing:
                handle.write(data[where], where)
            else:
                handle.read(selection)
            results[peer].wall.append(time.perf_counter() - t0)
            results[peer].cpu.append(time.process_time() - c0)
            results[peer].stats = proxy.reset()
    return results


def coalescing(max_gap: int | None) -> dict[str, Any]:
    """zarr's configuration for a ``--max-gap`` value: the gap (bytes) a
    sharded read reads through to merge two inner chunks' ranges into one
    GET. zarr_fused's async shard reader and zarr's sharding codec both take
    it from the array's config; tensorstore and zarrs have their own."""
    return {} if max_gap is None else {"array.sharding_coalesce_max_gap_bytes": max_gap}


def table(title: str, results: dict[str, Result], ours: str = "zarr_fused") -> list[str]:
    if ours not in results:  # only variants ran: the first is the base
        ours = next((p for p in results if p.startswith(ours)), ours)
    lines = [
        f"### {title}",
        "",
        (
            "| peer | median s | vs zarr_fused | client CPU s | GET | PUT | HEAD | other "
            "| MB in | MB out | in flight |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = results.get(ours)
    base_t = statistics.median(base.wall) if base and base.wall else None
    for peer, res in results.items():
        if res.error:
            lines.append(f"| {peer} | error: {res.error} | | | | | | | | | |")
            continue
        row = res.row()
        req = row["requests"]
        other = sum(v for k, v in req.items() if k not in ("GET", "PUT", "HEAD"))
        ratio = f"{row['median_s'] / base_t:.2f}x" if base_t else ""
        lines.append(
            f"| {peer} | {row['median_s']:.3f} | {ratio} | {row['cpu_s']:.3f} | {req.get('GET', 0)} | "
            f"{req.get('PUT', 0)} | {req.get('HEAD', 0)} | {other} | "
            f"{row['bytes_received'] / 1e6:.2f} | {row['bytes_sent'] / 1e6:.2f} | "
            f"{row['max_in_flight']} |"
        )
    return lines + [""]


def operations(scenario: Scenario | ChainScenario, args: argparse.Namespace) -> list[str]:
    return [op for op in scenario.operations if not args.operation or op in args.operation]


@dataclass
class Servers:
    """What the reads and the writes of one run are served by: moto behind
    the proxy, or the writable static server (``--server static``) over a
    local copy of each scenario's source array."""

    moto: MotoServer | None
    proxy: LatencyProxy | None
    static: StaticS3Server | None
    store_kind: str

    @property
    def timed(self) -> LatencyProxy | StaticS3Server:
        """What the timed calls go through (adding the latency, counting)."""
        timed = self.static or self.proxy
        assert timed is not None
        return timed

    def direct(self, prefix: str) -> Any:
        """A zarr store on ``prefix`` without the added latency or the
        counting: for the untimed setup and checks."""
        from zarr.storage import LocalStore

        if self.static is not None:
            return LocalStore(self.static.root / BUCKET / prefix)
        assert self.moto is not None
        return zarr_store(self.store_kind, self.moto.endpoint, prefix)

    @classmethod
    def start(
        cls, stack: contextlib.ExitStack, args: argparse.Namespace, scenarios: list[str]
    ) -> Servers:
        import zarr

        moto = proxy = static = None
        if args.server == "moto":
            moto = stack.enter_context(MotoServer())
            proxy = stack.enter_context(LatencyProxy(moto.endpoint))
            moto.create_bucket(BUCKET)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="s3-static-")))
            (root / BUCKET).mkdir()
            static = StaticS3Server(root, cpu=args.server_cpu, writable=True)
            stack.enter_context(static)
        servers = cls(moto, proxy, static, args.store)
        for name in scenarios:
            with zarr.config.set(zarr_config(WRITER)):
                store = servers.direct(f"{name}-source")
                SCENARIOS[name].create(store)[...] = SCENARIOS[name].data()
        return servers

    def set_latency(self, seconds: float) -> None:
        for server in (self.proxy, self.static):
            if server is not None:
                server.reset(latency=seconds)


def run_scenario(
    scenario: Scenario | ChainScenario,
    latency: float,
    peers: list[str],
    servers: Servers,
    args: argparse.Namespace,
    out: dict[str, Any],
) -> None:
    """Every selected operation of ``scenario`` at one latency (ms), once per
    ``--max-gap`` value; prints the tables and adds them to ``out``."""
    import zarr

    source = f"{scenario.name}-source"
    for operation, gap in it.product(operations(scenario, args), args.max_gap or [None]):
        with zarr.config.set(coalescing(gap)):
            results = measure(
                scenario,
                operation,
                peers,
                servers.timed,
                servers.direct,
                args.store,
                source,
                args.repeat,
            )
        title = f"{scenario.name} {operation}, {latency:g} ms" + (
            "" if gap is None else f", max gap {gap} B"
        )
        print("\n".join(table(title, results)), flush=True)
        out["results"][title] = {p: r.row() for p, r in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument(
        "--chain",
        action="append",
        default=[],
        help="read this chain of zarr_fused_testing.chains (repeatable), unsharded and "
        "sharded, instead of the scenarios",
    )
    parser.add_argument("--operation", action="append", help="only these operations")
    parser.add_argument(
        "--latency",
        type=float,
        action="append",
        help="added ms per request (repeatable; default 0 and 20)",
    )
    parser.add_argument("--peer", action="append", choices=PEERS, help="only these peers")
    parser.add_argument(
        "--fused-concurrency",
        type=int,
        action="append",
        help="run zarr_fused with this codec_pipeline.async_concurrency (repeatable; "
        "each a peer zarr_fused@N)",
    )
    parser.add_argument(
        "--bare-concurrency",
        type=int,
        action="append",
        help=f"run {BARE} (the same PUTs with no pipeline: a write's floor) with this many "
        f"in flight (repeatable; each a peer {BARE}@N; default {BARE_CONCURRENCY})",
    )
    parser.add_argument(
        "--max-gap",
        type=int,
        action="append",
        help="zarr's array.sharding_coalesce_max_gap_bytes for the zarr peers (repeatable; "
        "each operation runs once per value; default: zarr's, 1 MiB)",
    )
    parser.add_argument("--store", choices=["obstore", "s3fs"], default="obstore")
    parser.add_argument(
        "--server",
        choices=["moto", "static"],
        default="moto",
        help="what serves reads and writes: moto behind the latency proxy, or the light "
        "static server",
    )
    parser.add_argument("--server-cpu", type=int, help="pin the static server to this CPU")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    # tensorstore's "environment" credentials; moto accepts any
    os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    os.environ.setdefault("AWS_REGION", REGION)
    peers = []
    for peer in args.peer or PEERS:
        if peer == "zarr_fused" and args.fused_concurrency:
            peers.extend(f"{peer}{VARIANT}{n}" for n in args.fused_concurrency)
            continue
        if peer == BARE and args.bare_concurrency:
            peers.extend(f"{peer}{VARIANT}{n}" for n in args.bare_concurrency)
            continue
        why = available(peer)
        if why:
            print(f"skipping {peer}: {why}", file=sys.stderr)
        else:
            peers.append(peer)
    latencies = args.latency if args.latency is not None else [0.0, 20.0]
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.chain:
        SCENARIOS.clear()
        SCENARIOS.update(chain_scenarios(args.chain))
        scenarios = list(SCENARIOS)
        STRICT_OURS.append(True)
    warnings.simplefilter("ignore")  # zarr's experimental-pipeline and numcodecs notices

    out: dict[str, Any] = {"store": args.store, "server": args.server, "repeat": args.repeat}
    out["results"] = {}
    where = "moto behind the latency proxy" if args.server == "moto" else "the static server"
    cpus = sorted(os.sched_getaffinity(0))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"## S3 side by side ({args.store}, served by {where}, median of {args.repeat})\n"
        f"# CPUs {cpus}, load average at the start: {load}\n",
        flush=True,
    )
    try:
        with contextlib.ExitStack() as stack:
            servers = Servers.start(stack, args, scenarios)
            for name in scenarios:
                for latency in latencies:
                    servers.set_latency(latency / 1000)
                    run_scenario(SCENARIOS[name], latency, peers, servers, args, out)
    except ServerUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
