"""The plan of one pipeline: which path each stage of a read or write takes.

A plan is made once per array, in ``evolve_from_array_spec``, from the
evolved codec chain: the chain that decodes and encodes a whole chunk
(native kernels where zarr_fused has them, zarr's `ChunkTransform`
otherwise), the reader and writer the synchronous path uses, and the reason,
if any, why part of the work falls back to zarr's own code. The
orchestration in `zarr_fused.pipeline` only ever talks to the plan, so new
native paths arrive here without touching it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec
from zarr.codecs.cast_value import CastValue
from zarr.codecs.numcodecs import AsType, BitRound, FixedScaleOffset, Quantize
from zarr.codecs.scale_offset import ScaleOffset
from zarr.codecs.sharding import ShardingCodec
from zarr.codecs.transpose import TransposeCodec

from zarr_fused._chain import (
    NativeChain,
    TransformChain,
    build_chain,
    native_chain_params,
    native_tail,
)
from zarr_fused._hybrid import (
    FilteredChain,
    HybridChain,
    V2HybridChain,
    filtered_chain,
    hybrid_chain,
)
from zarr_fused._native import shard_kernels
from zarr_fused._plan_cache import PLAN_PARTS, Unkeyable, exact_key
from zarr_fused._vlen_chain import VlenChain
from zarr_fused._zarr_compat import (
    AsyncChunkTransform,
    ChunkTransform,
    codec_supports_sync,
    evolve_codecs,
    has_partial_decode,
    has_partial_encode,
    inner_chunk_spec,
)
from zarr_fused.chunks.async_read import AsyncChunkReader, ObjectChunkReader
from zarr_fused.chunks.async_write import AsyncChunkWriter
from zarr_fused.chunks.pipelined import PipelinedChunkReader
from zarr_fused.chunks.read import ChunkReader, NativeChunkReader, PartialDecodeReader
from zarr_fused.chunks.write import ChunkWriter, NativeChunkWriter, PartialEncodeWriter
from zarr_fused.errors import UnsupportedError
from zarr_fused.shard.async_read import AsyncShardReader
from zarr_fused.shard.async_write import AsyncShardWriter
from zarr_fused.shard.index import index_format
from zarr_fused.shard.pipelined import ShardIO
from zarr_fused.shard.read import ShardReader
from zarr_fused.shard.vlen import VlenShardReader, VlenShardWriter
from zarr_fused.shard.write import ShardWriter

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.abc.codec import Codec, CodecPipeline
    from zarr.core.array_spec import ArraySpec

    from zarr_fused._chain import Chain

__all__ = ["PipelinePlan", "build_plan", "shard_chain_reason"]

Reader = (
    ChunkReader
    | NativeChunkReader
    | PipelinedChunkReader
    | PartialDecodeReader
    | ShardReader
    | VlenShardReader
)
Writer = ChunkWriter | NativeChunkWriter | PartialEncodeWriter | ShardWriter | VlenShardWriter
#: the inner chains the shard engine runs: fixed-size items in its batch
#: kernels, vlen items in its per-shard loop (`zarr_fused.shard.vlen`)
InnerChain = NativeChain | FilteredChain | VlenChain

logger = logging.getLogger("zarr_fused")


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    array_bytes_codec: ArrayBytesCodec
    #: whole-chunk codec chain; None when a codec has no synchronous code
    chain: Chain | None
    #: per-chunk async codec chain, for codecs without synchronous code
    async_transform: AsyncChunkTransform
    #: the async path lets the array->bytes codec read partially (sharding)
    partial_decode: bool
    #: the synchronous path (None when ``chain`` is None)
    reader: Reader | None
    writer: Writer | None
    #: why some of the reading runs on zarr's own code ("" when none does)
    read_fallback: str
    #: why some of the writing runs on zarr's own code ("" when none does)
    write_fallback: str
    #: the unsharded reads and writes of the async path (and the shards
    #: zarr's sharding codec handles there); stateless, so one serves every
    #: thread and a forked child
    async_chunk_reader: AsyncChunkReader | ObjectChunkReader
    async_chunk_writer: AsyncChunkWriter
    #: the native shard reads of the async path (None: zarr's sharding codec)
    async_shard_reader: AsyncShardReader | None = None
    #: the native shard writes of the async path (None: zarr's sharding codec)
    async_shard_writer: AsyncShardWriter | None = None

    @property
    def fallback(self) -> str:
        """Every reason some work runs on zarr's code ("" when none does)."""
        return "; ".join(dict.fromkeys(r for r in (self.read_fallback, self.write_fallback) if r))

    def check(self, what: str, strict: bool) -> None:
        """Raise in strict mode when ``what`` ("read", "write", "decode",
        "encode") falls back; log it otherwise."""
        reason = self.read_fallback if what in ("read", "decode") else self.write_fallback
        if not reason:
            return
        if strict:
            raise UnsupportedError(
                f"zarr_fused cannot {what} natively: {reason}. "
                "Unset `codec_pipeline.strict` to let zarr's own code handle it."
            )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s falls back to zarr's code: %s", what, reason)


class _PinnedInnerSharding(ShardingCodec):
    """zarr's sharding codec, whose inner chunks always go through the
    pipeline of the array that holds it.

    zarr's own codec builds its inner pipeline from the configuration of the
    process that runs the read or write (``get_pipeline_class()``). An array
    pickled to a Dask worker configured otherwise would then decode its
    inner chunks with another pipeline on zarr's async path. The plan's
    async path uses this codec instead; the synchronous shard engine reads
    and writes shards itself.
    """

    _inner_pipeline_class: type[CodecPipeline]

    @property
    def codec_pipeline(self) -> CodecPipeline:
        return self._inner_pipeline_class.from_codecs(self.codecs)


def _pin_inner_pipeline(
    codecs: tuple[Codec, ...], pipeline_class: type[CodecPipeline] | None
) -> tuple[Codec, ...]:
    """``codecs`` with zarr's sharding codec replaced by one whose inner
    pipeline is ``pipeline_class`` (unchanged when None)."""
    if pipeline_class is None:
        return codecs
    pinned: list[Codec] = []
    for codec in codecs:
        if type(codec) is ShardingCodec:
            # built from the parsed codec objects (not from their names, which
            # need not be registered)
            copy = _PinnedInnerSharding(
                chunk_shape=codec.chunk_shape,
                codecs=codec.codecs,
                index_codecs=codec.index_codecs,
                index_location=codec.index_location,
                subchunk_write_order=codec.subchunk_write_order,
            )
            object.__setattr__(copy, "_inner_pipeline_class", pipeline_class)
            codec = copy
        pinned.append(codec)
    return tuple(pinned)


#: filters that map each value on its own, whatever the items' order (not
#: delta, whose running sum follows it)
_ELEMENTWISE = (AsType, BitRound, CastValue, FixedScaleOffset, Quantize, ScaleOffset)


def _transposes_last(codecs: tuple[Codec, ...]) -> tuple[Codec, ...]:
    """``codecs`` with the transposes among their leading array->array
    codecs composed into one after the filters, when every filter is
    elementwise: a transpose then commutes with them, so the stored bytes
    are the same and the batch kernels filter the stored items in their
    order. Else ``codecs`` as they are."""
    lead = 0
    while lead < len(codecs) and isinstance(codecs[lead], ArrayArrayCodec):
        lead += 1
    transposes = [c for c in codecs[:lead] if type(c) is TransposeCodec]
    filters = [c for c in codecs[:lead] if type(c) is not TransposeCodec]
    if not transposes or not filters or not all(isinstance(c, _ELEMENTWISE) for c in filters):
        return codecs
    order = tuple(range(len(transposes[0].order)))
    for transpose in transposes:
        order = tuple(order[i] for i in transpose.order)
    return (*filters, TransposeCodec(order=order), *codecs[lead:])


def shard_chain_reason(codec: Any, spec: ArraySpec) -> tuple[str, InnerChain | None]:
    """("", inner chain) when the shard engine (`ShardReader`,
    `ShardWriter`) can read and write ``codec``'s shards, else (why not,
    None)."""
    if shard_kernels is None:
        return "the compiled extensions are missing", None
    if type(codec) is not ShardingCodec:
        return f"{type(codec).__name__} reads with zarr's code", None
    if index_format(codec) is None:
        names = " -> ".join(type(c).__name__ for c in codec.index_codecs)
        return f"no native reader for the shard index codecs {names}", None
    inner_spec = inner_chunk_spec(codec, spec)
    inner_codecs = evolve_codecs(codec.codecs, inner_spec)
    reason, params = native_chain_params(inner_codecs, inner_spec)
    fallback = TransformChain(ChunkTransform(codecs=inner_codecs), "")
    if reason:
        # leading filters with kernels run inside the batch kernels
        filtered = filtered_chain(_transposes_last(inner_codecs), inner_spec, fallback, native_tail)
        if filtered is not None:
            return "", filtered
        vlen = build_chain(inner_codecs, inner_spec, ChunkTransform(codecs=inner_codecs))
        if isinstance(vlen, VlenChain):
            return "", vlen
        return f"inner chunks: {reason}", None
    return "", NativeChain(inner_spec, params, fallback)


@dataclass(frozen=True, slots=True)
class _PlanParts:
    """What a plan derives from its codecs and chunk spec alone, shared by
    the plans of arrays whose metadata match (`zarr_fused._plan_cache`):
    no reader or writer, which learn from the files they read."""

    async_transform: AsyncChunkTransform
    async_array_bytes_codec: ArrayBytesCodec
    chain: Chain | None
    #: the `FilteredChain` whose batch kernels read whole chunks in groups
    #: (`_grouped_reader`), or None
    grouped: FilteredChain | None
    #: `shard_chain_reason` when the array->bytes codec reads or writes
    #: partially, else None
    shard: tuple[str, InnerChain | None] | None
    #: the reason when there is no synchronous path ("" otherwise)
    no_sync: str


def build_plan(
    codecs: tuple[Codec, ...],
    array_bytes_codec: ArrayBytesCodec,
    spec: ArraySpec | None,
    sync_transform: ChunkTransform | None,
    *,
    partial_decode: bool,
    partial_encode: bool,
    pipeline_class: type[CodecPipeline] | None = None,
) -> PipelinePlan:
    """Plan the read and write paths for an (evolved) codec chain.

    ``spec`` is the array's chunk spec from ``evolve_from_array_spec``;
    None for a pipeline that was never evolved, which zarr itself only runs
    on its async path. With ``pipeline_class``, the async path runs the inner
    chunks of a sharded array through that pipeline, whatever the process's
    configuration says.
    """
    # the same dispatch as zarr's FusedCodecPipeline: a codec that
    # implements the partial mixins but only their async methods takes
    # the whole-chunk path
    decodes = partial_decode and has_partial_decode(array_bytes_codec)
    encodes = partial_encode and has_partial_encode(array_bytes_codec)

    def build() -> _PlanParts:
        return _plan_parts(
            codecs, array_bytes_codec, spec, sync_transform, pipeline_class, (decodes, encodes)
        )

    try:
        key = (
            pipeline_class,
            exact_key(codecs),
            exact_key(spec),
            sync_transform is None,
            decodes,
            encodes,
        )
    except Unkeyable:
        parts = build()
    else:
        parts = PLAN_PARTS.get(key, build)
    return _plan_from_parts(parts, array_bytes_codec, partial_decode, (decodes, encodes))


def _plan_parts(
    codecs: tuple[Codec, ...],
    array_bytes_codec: ArrayBytesCodec,
    spec: ArraySpec | None,
    sync_transform: ChunkTransform | None,
    pipeline_class: type[CodecPipeline] | None,
    partial: tuple[bool, bool],
) -> _PlanParts:
    """The chains of a plan (see `_PlanParts`); ``partial``: whether the
    array->bytes codec decodes and encodes partially, synchronously."""
    async_transform, async_array_bytes_codec = _async_codecs(
        codecs, array_bytes_codec, pipeline_class
    )
    if spec is None or sync_transform is None:
        reason = _no_sync_reason(codecs, spec)
        return _PlanParts(async_transform, async_array_bytes_codec, None, None, None, reason)
    chain = build_chain(codecs, spec, sync_transform)
    if isinstance(chain, TransformChain):
        chain = hybrid_chain(codecs, spec, chain, native_tail) or chain
    grouped: FilteredChain | None = None
    if not partial[0] and isinstance(chain, HybridChain):
        # every filter has a kernel (a leading transpose, a Python stage
        # of the hybrid chain, moved after elementwise ones as the shard
        # engine does): local chunk files read in groups
        grouped = filtered_chain(_transposes_last(codecs), spec, chain.fallback, native_tail)
    elif not partial[0] and isinstance(chain, V2HybridChain):
        grouped = chain.fused  # format 2: the same groups
    # one answer for the reader and the writer: finding the inner chain
    # evolves and resolves the inner codecs
    shard = shard_chain_reason(array_bytes_codec, spec) if any(partial) else None
    return _PlanParts(async_transform, async_array_bytes_codec, chain, grouped, shard, "")


def _plan_from_parts(
    parts: _PlanParts,
    array_bytes_codec: ArrayBytesCodec,
    partial_decode: bool,
    partial: tuple[bool, bool],
) -> PipelinePlan:
    """A plan with its own readers and writers over ``parts``' chains."""
    chain = parts.chain
    reader: Reader | None = None
    writer: Writer | None = None
    if chain is None:
        read_fallback = write_fallback = parts.no_sync
    else:
        found = parts.shard if partial[0] else None
        reader, read_fallback = _path(_READERS, chain, array_bytes_codec, found)
        if type(reader) is ChunkReader and parts.grouped is not None:
            reader = _grouped_reader(chain, parts.grouped)
        found = parts.shard if partial[1] else None
        writer, write_fallback = _path(_WRITERS, chain, array_bytes_codec, found)
        if type(writer) is ChunkWriter and parts.grouped is not None:
            writer = NativeChunkWriter(parts.grouped, writer)
    sharded = isinstance(parts.async_array_bytes_codec, ShardingCodec)
    return PipelinePlan(
        parts.async_array_bytes_codec,
        chain,
        parts.async_transform,
        partial_decode,
        reader,
        writer,
        read_fallback,
        write_fallback,
        _async_chunk_reader(chain, parts.async_transform),
        AsyncChunkWriter(chain, parts.async_transform, sharded),
        AsyncShardReader(reader) if isinstance(reader, ShardReader) else None,
        AsyncShardWriter(writer) if isinstance(writer, ShardWriter) else None,
    )


def _grouped_reader(chain: Chain, grouped: FilteredChain) -> Reader:
    """Whole chunks of a chain whose every filter has a kernel: read in
    groups by the batch kernels of ``grouped``, local chunk files through
    the IO threads as a native chain's are; what the kernels cannot write
    into through ``chain`` (the hybrid chain, zarr's code for its Python
    stages)."""
    return PipelinedChunkReader(grouped, NativeChunkReader(grouped, ChunkReader(chain)))


def _async_codecs(
    codecs: tuple[Codec, ...],
    array_bytes_codec: ArrayBytesCodec,
    pipeline_class: type[CodecPipeline] | None,
) -> tuple[AsyncChunkTransform, ArrayBytesCodec]:
    """The async path's chunk transform and array->bytes codec: ``codecs``
    with the sharding codec's inner pipeline pinned to ``pipeline_class``."""
    async_codecs = _pin_inner_pipeline(codecs, pipeline_class)
    async_array_bytes_codec = next(
        (
            pinned
            for c, pinned in zip(codecs, async_codecs, strict=True)
            if c is array_bytes_codec and isinstance(pinned, ArrayBytesCodec)
        ),
        array_bytes_codec,
    )
    return AsyncChunkTransform(codecs=async_codecs), async_array_bytes_codec


def _no_sync_reason(codecs: tuple[Codec, ...], spec: ArraySpec | None) -> str:
    """Why a plan has no synchronous path (everything runs on the async path)."""
    if spec is None:
        return "the pipeline was not evolved for an array"
    names = ", ".join(type(c).__name__ for c in codecs if not codec_supports_sync(c))
    return f"codecs without synchronous implementations ({names})"


def _async_chunk_reader(
    chain: Chain | None, transform: AsyncChunkTransform
) -> AsyncChunkReader | ObjectChunkReader:
    """The async path's unsharded reader: a native chain reads zarr's
    ``ObjectStore`` keys in groups, and any other batch a chunk at a time."""
    generic = AsyncChunkReader(chain, transform)
    return ObjectChunkReader(chain, generic) if isinstance(chain, NativeChain) else generic


@dataclass(frozen=True, slots=True)
class _Paths[P]:
    """The synchronous paths of one direction (the readers, or the
    writers), from which `_path` picks one per array."""

    #: through the array->bytes codec's own partial decode or encode
    partial: Callable[[ArrayBytesCodec], P]
    #: the shard engine (its codec, inner chain, and the partial path it
    #: hands what its kernels do not serve: a `BatchReader` or a `HeldWriter`)
    shards: Callable[[Any, NativeChain | FilteredChain, Any], P]
    #: the same for vlen inner chunks (`zarr_fused.shard.vlen`)
    vlen_shards: Callable[[Any, VlenChain, Any], P]
    #: whole chunks through a native chain
    native: Callable[[NativeChain], P]
    #: whole chunks through any other chain
    whole: Callable[[Chain], P]


_READERS: _Paths[Reader] = _Paths(
    PartialDecodeReader,
    lambda codec, inner, partial: ShardReader(codec, inner, partial, ShardIO()),
    # the engine's reader fetches the shards (its kernels are not used)
    lambda codec, inner, partial: VlenShardReader(
        codec, inner, partial, ShardReader(codec, cast("NativeChain", inner), partial)
    ),
    # LocalStore chunk files go through the IO threads; any other store
    # through the NativeChunkReader the pipelined reader wraps
    lambda chain: PipelinedChunkReader(chain, NativeChunkReader(chain, ChunkReader(chain))),
    ChunkReader,
)
_WRITERS: _Paths[Writer] = _Paths(
    PartialEncodeWriter,
    ShardWriter,
    VlenShardWriter,
    lambda chain: NativeChunkWriter(chain, ChunkWriter(chain)),
    ChunkWriter,
)


def _path[P](
    paths: _Paths[P],
    chain: Chain,
    codec: ArrayBytesCodec,
    shard: tuple[str, InnerChain | None] | None,
) -> tuple[P, str]:
    """The path of ``paths`` for this array, and why any of its work falls
    back to zarr's code ("" if none). ``shard``: `shard_chain_reason` when
    the codec reads or writes partially (sharding), synchronously, else None."""
    if shard is not None:
        fallback = paths.partial(codec)
        reason, inner = shard
        if inner is None:
            return fallback, reason
        if isinstance(inner, VlenChain):
            return paths.vlen_shards(codec, inner, fallback), reason
        return paths.shards(codec, inner, fallback), reason
    if isinstance(chain, NativeChain):
        return paths.native(chain), chain.reason
    return paths.whole(chain), chain.reason
