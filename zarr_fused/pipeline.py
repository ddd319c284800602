"""The zarr-facing class: `zarr_fused.FusedCodecPipeline`.

It keeps the interface and observable behaviour of zarr's own
``zarr.core.codec_pipeline.FusedCodecPipeline`` (and subclasses it, so code
that checks ``isinstance(p, zarr.core.codec_pipeline.FusedCodecPipeline)``
treats it alike); what differs is underneath. Each array gets a plan
(`zarr_fused._plan`) that routes every stage to native kernels where they
apply, and reads and writes run on zarr_fused's own thread pool
(`zarr_fused._pool`), sized from the CPUs the process may really use.

This module holds only orchestration: the sync/async gate, one thread hop
per batch, strict mode. ``read``, ``write``, ``read_sync`` and
``write_sync`` must stay in a ``.py`` module: zarr's conformance suite
inspects their source.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from warnings import warn

from zarr.abc.store import SyncByteGetter, SyncByteSetter
from zarr.codecs.sharding import ShardingCodec
from zarr.core import codec_pipeline as _zarr_pipeline
from zarr.core.codec_pipeline import codecs_from_list, codecs_from_list_unchecked
from zarr.core.config import config as zarr_config
from zarr.registry import register_pipeline
from zarr.storage import StorePath

from zarr_fused._async_path import read_async, write_async
from zarr_fused._batch import ReadRequest, WriteRequest
from zarr_fused._cpus import resolve_max_workers
from zarr_fused._native import missing_message
from zarr_fused._plan import PipelinePlan, build_plan
from zarr_fused._pool import off_loop
from zarr_fused._zarr_compat import ChunkTransform, evolve_codecs, store_supports_sync_io
from zarr_fused.config import strict_mode
from zarr_fused.errors import NativeExtensionError, ZarrFusedWarning
from zarr_fused.io.full import write_with_fewer_in_flight
from zarr_fused.io.stores import with_local_files
from zarr_fused.stats import active, counted

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Self

    from zarr.abc.codec import Codec, GetResult
    from zarr.abc.store import ByteGetter, ByteSetter
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._plan import Reader, Writer
    from zarr_fused.stats import Stats

__all__ = ["FusedCodecPipeline"]

logger = logging.getLogger("zarr_fused")

_warned_missing = False
_warn_lock = threading.Lock()


def note_missing_extensions(strict: bool) -> None:
    """Tell the user, once, that the native code is missing; raise in strict mode."""
    global _warned_missing
    message = missing_message()
    if not message:
        return
    if strict:
        raise NativeExtensionError(message)
    if not _warned_missing:
        with _warn_lock:
            if not _warned_missing:
                _warned_missing = True
                warn(message, ZarrFusedWarning, stacklevel=3)
    logger.debug("native extensions missing: %s", message)


def _has_sync_io(target: Any, *, write: bool) -> bool:
    """zarr's gate for the synchronous path: a store path whose store serves
    the whole synchronous surface, or another getter/setter (the sharding
    codec's in-memory ones) that implements the sync protocol."""
    if isinstance(target, StorePath):
        return store_supports_sync_io(target.store)
    return isinstance(target, SyncByteSetter if write else SyncByteGetter)


@dataclass(frozen=True)
class FusedCodecPipeline(_zarr_pipeline.FusedCodecPipeline):
    """Codec pipeline running zarr's codec chains on native kernels.

    Select it with ``zarr.config.set({"codec_pipeline.path":
    "zarr_fused.FusedCodecPipeline"})`` or the environment variable
    ``ZARR_CODEC_PIPELINE__PATH=zarr_fused.FusedCodecPipeline``. See
    `zarr_fused.config` for the settings it reads.
    """

    #: the routing decisions for this array (None only before evolving)
    plan: PipelinePlan | None = field(default=None, compare=False, repr=False)
    #: the chunk spec this pipeline was evolved against (None before evolving)
    array_spec: ArraySpec | None = field(default=None, compare=False, repr=False)

    # -- construction --------------------------------------------------------------

    @classmethod
    def _assemble(
        cls, codecs: tuple[Codec, ...], batch_size: int, array_spec: ArraySpec | None
    ) -> Self:
        """Build from an already validated (and, with a spec, evolved) chain."""
        aa, ab, bb = codecs_from_list_unchecked(codecs)
        sync_transform: ChunkTransform | None = None
        if array_spec is not None:
            try:
                sync_transform = ChunkTransform(codecs=codecs)
            except TypeError:  # some codec has no synchronous implementation
                sync_transform = None
        partial_decode = _zarr_pipeline.pipeline_supports_partial_decode(
            ab, array_array_codecs=aa, bytes_bytes_codecs=bb, require_no_aa_bb=True
        )
        partial_encode = _zarr_pipeline.pipeline_supports_partial_encode(
            ab, array_array_codecs=aa, bytes_bytes_codecs=bb, require_no_aa_bb=True
        )
        plan = build_plan(
            codecs,
            ab,
            array_spec,
            sync_transform,
            partial_decode=partial_decode,
            partial_encode=partial_encode,
            pipeline_class=cls,
        )
        return cls(
            codecs=codecs,
            array_array_codecs=aa,
            array_bytes_codec=ab,
            bytes_bytes_codecs=bb,
            sync_transform=sync_transform,
            batch_size=batch_size,
            plan=plan,
            array_spec=array_spec,
        )

    @classmethod
    def from_codecs(cls, codecs: Iterable[Codec], *, batch_size: int | None = None) -> Self:
        codec_list = tuple(codecs)
        codecs_from_list(codec_list)  # validates the order, warns like zarr
        if batch_size is None:
            batch_size = zarr_config.get("codec_pipeline.batch_size")
        return cls._assemble(codec_list, batch_size, None)

    def evolve_from_array_spec(self, array_spec: ArraySpec) -> Self:
        evolved = evolve_codecs(self.codecs, array_spec)
        return type(self)._assemble(evolved, self.batch_size, array_spec)

    def __reduce__(self) -> tuple[Any, ...]:
        # Native state (kernel handles, caches) never travels: the receiving
        # process rebuilds the plan from the codecs and the spec.
        return (_rebuild, (type(self), self.codecs, self.batch_size, self.array_spec))

    # -- helpers ---------------------------------------------------------------------

    def _checked_plan(self, what: str) -> PipelinePlan:
        plan = self.plan
        if plan is None:  # constructed directly, not through from_codecs
            plan = type(self)._assemble(self.codecs, self.batch_size, self.array_spec).plan
            assert plan is not None
        strict = strict_mode()
        note_missing_extensions(strict)
        plan.check(what, strict)
        return plan

    def _sync_plan(self, what: str) -> PipelinePlan:
        plan = self._checked_plan(what)
        if plan.reader is None or plan.writer is None:
            raise RuntimeError(
                "This codec pipeline contains codecs without synchronous support; "
                "use the async read/write path instead."
            )
        return plan

    def _sync_reader(self) -> Reader:
        reader = self._sync_plan("read").reader
        assert reader is not None  # `_sync_plan` checked it
        return reader

    def _sync_writer(self) -> Writer:
        writer = self._sync_plan("write").writer
        assert writer is not None  # `_sync_plan` checked it
        return writer

    # -- batch decode / encode (the CodecPipeline interface) -------------------------

    async def decode(
        self, chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]
    ) -> Iterable[NDBuffer | None]:
        return await self._each_chunk("decode", chunk_bytes_and_specs)

    async def encode(
        self, chunk_arrays_and_specs: Iterable[tuple[NDBuffer | None, ArraySpec]]
    ) -> Iterable[Buffer | None]:
        return await self._each_chunk("encode", chunk_arrays_and_specs)

    async def _each_chunk(
        self, what: Literal["decode", "encode"], pairs: Iterable[tuple[Any, ArraySpec]]
    ) -> list[Any]:
        """``what`` each chunk of ``pairs`` (None stays None): through the
        native chain in one hop off the event loop, else zarr's async
        transform chunk by chunk."""
        items = list(pairs)
        plan = self._checked_plan(what)
        chain = plan.chain
        if chain is None:
            transform = plan.async_transform
            step: Any = transform.decode_chunk if what == "decode" else transform.encode_chunk
            return [None if data is None else await step(data, spec) for data, spec in items]
        native: Any = chain.decode if what == "decode" else chain.encode

        def each() -> list[Any]:
            return [None if data is None else native(data, spec) for data, spec in items]

        return await off_loop(each)

    # -- synchronous read / write ----------------------------------------------------

    def read_sync(
        self,
        batch_info: Iterable[tuple[ByteGetter, ArraySpec, SelectorTuple, SelectorTuple, bool]],
        out: NDBuffer,
        drop_axes: tuple[int, ...] = (),
        max_workers: int = 1,
    ) -> tuple[GetResult, ...]:
        """Read a batch with synchronous IO: fetch, decode and scatter each
        chunk, spread over ``max_workers`` threads (1: the calling thread)."""
        batch = list(batch_info)
        if not batch:
            return ()
        reader = self._sync_reader()
        sink = active()
        if sink is None:
            return reader.read(batch, ReadRequest(out, drop_axes, max_workers))
        batch = counted(batch, sink, local_native=getattr(reader, "local_native", False))
        start = time.perf_counter()
        results = reader.read(batch, ReadRequest(out, drop_axes, max_workers, sink))
        self._count(sink, "read", batch, start, results)
        return results

    def write_sync(
        self,
        batch_info: Iterable[tuple[ByteSetter, ArraySpec, SelectorTuple, SelectorTuple, bool]],
        value: NDBuffer,
        drop_axes: tuple[int, ...] = (),
        max_workers: int = 1,
    ) -> None:
        """Write a batch with synchronous IO: fetch existing bytes where the
        write is partial, merge, encode and store (or delete) each chunk,
        spread over ``max_workers`` threads (1: the calling thread)."""
        batch = list(batch_info)
        if not batch:
            return
        writer = self._sync_writer()
        sink = active()
        batch = counted(batch, sink)
        request = WriteRequest(value, drop_axes, max_workers, sink)
        start = time.perf_counter()
        # on a full disk, again with fewer files in flight (zarr_fused.io.full)
        write_with_fewer_in_flight(
            lambda workers: writer.write(batch, request.with_workers(workers)), max_workers
        )
        if sink is not None:
            self._count(sink, "write", batch, start)

    # -- asynchronous read / write (what zarr calls) ----------------------------------

    async def read(
        self,
        batch_info: Iterable[tuple[ByteGetter, ArraySpec, SelectorTuple, SelectorTuple, bool]],
        out: NDBuffer,
        drop_axes: tuple[int, ...] = (),
    ) -> tuple[GetResult, ...]:
        batch = list(batch_info)
        if not batch:
            return ()
        batch = with_local_files(batch)
        plan = self.plan
        getter, *_ = batch[0]
        if plan is not None and plan.reader is not None and _has_sync_io(getter, write=False):
            # One thread hop for the whole batch. Running it inline would block
            # the event loop that every zarr sync-API call in the process shares.
            return await off_loop(
                self.read_sync, batch, out, drop_axes, max_workers=resolve_max_workers()
            )
        plan = self._checked_plan("read")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("read of %d chunks takes the async path", len(batch))
        sink = active()
        batch = counted(batch, sink)
        start = time.perf_counter()
        request = ReadRequest(out, drop_axes, resolve_max_workers(), sink)
        results = await read_async(plan, batch, request)
        if sink is not None:
            self._count(sink, "read", batch, start, results)
        return results

    async def write(
        self,
        batch_info: Iterable[tuple[ByteSetter, ArraySpec, SelectorTuple, SelectorTuple, bool]],
        value: NDBuffer,
        drop_axes: tuple[int, ...] = (),
    ) -> None:
        batch = list(batch_info)
        if not batch:
            return
        batch = with_local_files(batch, write=True)
        plan = self.plan
        setter, *_ = batch[0]
        if plan is not None and plan.writer is not None and _has_sync_io(setter, write=True):
            await off_loop(
                self.write_sync, batch, value, drop_axes, max_workers=resolve_max_workers()
            )
            return
        plan = self._checked_plan("write")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("write of %d chunks takes the async path", len(batch))
        sink = active()
        batch = counted(batch, sink)
        start = time.perf_counter()
        await write_async(plan, batch, WriteRequest(value, drop_axes, resolve_max_workers(), sink))
        if sink is not None:
            self._count(sink, "write", batch, start)

    def _count(
        self,
        sink: Stats,
        what: Literal["read", "write"],
        batch: list[Any],
        start: float,
        results: tuple[GetResult, ...] = (),
    ) -> None:
        """Count one batch into ``sink`` (see `zarr_fused.stats`)."""
        plan = self.plan
        fallback = ""
        if plan is not None:
            fallback = plan.read_fallback if what == "read" else plan.write_fallback
        sharded = isinstance(self.array_bytes_codec, ShardingCodec)
        sink.call(what, batch, sharded, time.perf_counter() - start, fallback, results)


def _rebuild(
    cls: type[FusedCodecPipeline],
    codecs: tuple[Codec, ...],
    batch_size: int,
    array_spec: ArraySpec | None,
) -> FusedCodecPipeline:
    return cls._assemble(codecs, batch_size, array_spec)


# zarr's registry keys a pipeline by ``cls.__module__ + "." + cls.__qualname__``
# and users name it in `codec_pipeline.path`: present the class under the
# package, where it is also importable (pickle resolves it there too).
FusedCodecPipeline.__module__ = "zarr_fused"
register_pipeline(FusedCodecPipeline)
