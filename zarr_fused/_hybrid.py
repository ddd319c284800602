"""Hybrid chains: array->array stages without a native kernel run zarr's
code, the rest of the chain runs natively.

A chain such as ``numcodecs.delta -> bytes -> zstd`` used to leave the
native path entirely, because one stage had no kernel. A `HybridChain`
splits it in two:

- the *stages*: the leading array->array codecs up to the last one the
  tail does not cover (a transpose after it stays in the tail), run on
  each decoded chunk, on the pool thread that decodes it: with a native
  kernel where `zarr_fused._filter_stages` has one (``numcodecs.delta``,
  ``fixedscaleoffset``, ``quantize``, ``bitround``, ``astype``; zarr's
  ``scale_offset``), else with zarr's own ``_decode_sync`` / ``_encode_sync``
  (a *Python stage*);
- the *native tail*: the rest (``[transpose] -> bytes -> [compressor]`` with
  its checksums), a `NativeChain` built for the chunk spec the Python stages
  resolve to, so decompression, checksums and byte swaps run in the kernels
  with the GIL released, and the decoded chunk is scattered natively.

The chain records which stages run Python and why (its ``reason``), so the
plan logs it as a fallback and strict mode still rejects the array: a
Python stage is zarr's code. A chain whose every stage is native has no
reason, and strict mode accepts it. Values and stored bytes are zarr's:
the Python stages are zarr's codecs, the native ones give numcodecs'
bytes, and the tail is the native chain that already matches zarr's.

The shard engine queues a shard's inner chunks as C tasks and decodes
them in one nogil section, with no Python call per chunk, so a hybrid
chain's per-chunk stages do not fit it. A `FilteredChain` does: when
every stage has a kernel (a transpose only after them: see
`zarr_fused._plan`), it hands the
stages to the batches as one `zarr_fused._filters.FilterChain`, which
the batch kernels run on each chunk between decompression and scatter
(`zarr_fused._codec_batch`). The same `FilteredChain` reads an unsharded
array's chunk files from a plain `zarr.storage.LocalStore` in groups
(`zarr_fused.chunks.read.ChunkReader`), format-2 chains included
(`V2HybridChain`), so a hybrid chain's per-chunk stages remain for the
other stores and for chains with a Python stage.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from numcodecs.shuffle import Shuffle
from zarr.abc.codec import ArrayArrayCodec
from zarr.codecs.transpose import TransposeCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.dtype import get_data_type_from_native_dtype

from zarr_fused._batch_chain import BatchChain
from zarr_fused._filter_stages import PythonStage, native_stage, stage, v2_native_stages
from zarr_fused._items import describe_chunk
from zarr_fused._native import batch_kernels, filter_kernels
from zarr_fused._scatter_py import DecodeThenScatter
from zarr_fused._v2 import (
    V2Codec,
    V2Shuffle,
    split_v2_shuffle,
    v2_filtered_layout,
    v2_order_kept,
)
from zarr_fused._zarr_compat import codec_decode_sync, codec_encode_sync

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.abc.codec import Codec
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._chain import NativeChain, TransformChain
    from zarr_fused._items import ReadItem

    #: `zarr_fused._chain.native_tail`: the native chain for codecs that run
    #: after the Python stages, on a chunk of the given spec, or None
    NativeTail = Callable[[tuple[Codec, ...], ArraySpec, str], NativeChain | None]

__all__ = [
    "FilteredChain",
    "HybridChain",
    "V2HybridChain",
    "filtered_chain",
    "hybrid_chain",
    "split_python_stages",
    "v2_fused",
]


def split_python_stages(codecs: tuple[Codec, ...]) -> int:
    """How many leading codecs of ``codecs`` run as Python stages: the
    array->array codecs up to and including the last one that is not a
    transpose (0 when every array->array codec is a transpose)."""
    split = 0
    for index, codec in enumerate(codecs):
        if not isinstance(codec, ArrayArrayCodec):
            break
        if type(codec) is not TransposeCodec:
            split = index + 1
    return split


def _stage_specs(stages: tuple[Any, ...], spec: ArraySpec) -> list[ArraySpec]:
    """The chunk spec before each stage, then the one after the last."""
    specs = [spec]
    for codec in stages:
        specs.append(codec.resolve_metadata(specs[-1]))
    return specs


def _spec_key(spec: ArraySpec) -> tuple[Any, ...] | None:
    """A key equal for chunk specs that resolve alike (a NaN fill value
    too), or None when some part of ``spec`` cannot be hashed."""
    fill = np.asarray(spec.fill_value)
    key = (spec.shape, spec.dtype, spec.config, spec.prototype, fill.dtype.str, fill.tobytes())
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _SpecCache:
    """Per chunk spec, what a hybrid chain derives from it: resolving a
    spec through zarr's codecs and data type registry costs more than
    decoding a small chunk, and every chunk of an array has the same.

    zarr hands every chunk of a batch one spec object, frozen: the last
    one seen answers before its key is built (which costs more than the
    lookup)."""

    def __init__(self, derive: Callable[[ArraySpec], Any]) -> None:
        self.derive = derive
        self.cache: dict[tuple[Any, ...], Any] = {}
        self.last: tuple[ArraySpec, Any] | None = None

    def __call__(self, spec: ArraySpec) -> Any:
        last = self.last  # one read: another thread may replace it
        if last is not None and last[0] is spec:
            return last[1]
        key = _spec_key(spec)
        if key is None:
            return self.derive(spec)
        found = self.cache.get(key, self)
        if found is self:
            # two threads may both derive it: the same value, set twice
            found = self.cache[key] = self.derive(spec)
        self.last = (spec, found)
        return found


class HybridChain(DecodeThenScatter):
    """Array->array stages over a native tail (see the module); native
    when every stage is (``reason`` empty)."""

    def __init__(
        self,
        stages: tuple[PythonStage, ...],
        tail: NativeChain,
        fallback: TransformChain,
        reason: str,
    ) -> None:
        self.stages = stages
        self.tail = tail
        self.fallback = fallback
        self.reason = reason
        self.native = not reason
        self._specs = _SpecCache(self._derive_specs)

    def _derive_specs(self, spec: ArraySpec) -> list[ArraySpec] | None:
        """The stage specs of a chunk of ``spec``; None when the native tail
        cannot take the chunk those stages resolve to (zarr's chain then
        runs the whole chunk)."""
        specs = _stage_specs(self.stages, spec)
        return specs if self.tail.handles(specs[-1]) else None

    def _after_stages(self, chunk: NDBuffer, specs: list[ArraySpec]) -> NDBuffer:
        """Undo the Python stages on a chunk the tail decoded."""
        for codec, stage_spec in zip(self.stages[::-1], specs[-2::-1], strict=True):
            chunk = codec.decode(chunk, stage_spec)
        return chunk

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer:
        specs = self._specs(spec)
        if specs is None:
            return self.fallback.decode(raw, spec)
        decoded = self.tail.decode_array(raw, specs[-1], key)
        chunk = specs[-1].prototype.nd_buffer.from_ndarray_like(decoded)
        return self._after_stages(chunk, specs)

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        specs = self._specs(spec)
        if specs is None:
            return self.fallback.encode(array, spec)
        chunk: NDBuffer | None = array
        for codec, stage_spec in zip(self.stages, specs, strict=False):
            assert chunk is not None
            chunk = codec.encode(chunk, stage_spec)
            if chunk is None:  # the stage elides the chunk, as in zarr's chain
                return None
        assert chunk is not None
        inner = specs[-1]
        data = chunk.as_ndarray_like()
        if data.shape != inner.shape and data.size == math.prod(inner.shape):
            # numcodecs filters return flat arrays; the bytes codec stores
            # them in C order, which is this reshape's order
            chunk = inner.prototype.nd_buffer.from_ndarray_like(data.reshape(inner.shape))
        return self.tail.encode(chunk, inner, key)


def _flat_spec(spec: ArraySpec, count: int, itemsize: int) -> ArraySpec:
    """The spec of the filtered chunk as the native tail sees it: ``count``
    little-endian unsigned integers of ``itemsize`` bytes, in C order."""
    zdtype = get_data_type_from_native_dtype(np.dtype(f"<u{itemsize}"))
    return ArraySpec(
        shape=(count,),
        dtype=zdtype,
        fill_value=zdtype.default_scalar(),
        config=ArrayConfig(order="C", write_empty_chunks=spec.config.write_empty_chunks),
        prototype=spec.prototype,
    )


class V2HybridChain(DecodeThenScatter):
    """A zarr format 2 chunk with filters: the compressor runs natively
    over the filtered bytes, whose size the filters fix
    (`v2_filtered_layout`), and a last ``Shuffle`` with it
    (`split_v2_shuffle`); the filters before the tail (``head``) run
    native stages where each has one (``stages``; then ``native``), else
    zarr's code (a `V2Codec` of them without a compressor), as it does
    for the chunks whose layout only zarr's code reproduces
    (`v2_order_kept`).

    numcodecs filters see the chunk flattened in the array's order (zarr's
    `V2Codec` casts it to that order and numcodecs flattens with ``"A"``):
    the native stages take the items in that order, and an F-order chunk
    comes back as an F-order view of the decoded items. When every native
    stage has a kernel step, ``fused`` (a `FilteredChain`, `v2_fused`)
    reads a chunk into the output in one batch kernel call instead."""

    def __init__(
        self,
        codec: V2Codec,
        head: tuple[Any, ...],
        tail: NativeChain,
        fallback: TransformChain,
        reason: str,
    ) -> None:
        self.all_filters = tuple(codec.filters or ())
        self.filters = V2Codec(filters=head or None, compressor=None)
        # with a reason, zarr's code runs the filters (see `_v2_hybrid`)
        self.stages = None if reason else v2_stages(head)
        self.tail = tail
        self.fallback = fallback
        self.reason = reason
        self.native = not reason
        self._tail_spec = _SpecCache(self._derive_tail_spec)
        #: the native stages and the tail in one batch kernel, straight into
        #: the output (`v2_fused`), or None
        self.fused: FilteredChain | None = None

    def decode_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        # one nogil call decompresses, filters and scatters the chunk: no
        # chunk-sized arrays in between, no Python per stage
        fused, spec = self.fused, item[1]
        if fused is not None and fused.handles(spec) and self._tail_spec(spec) is not None:
            fused.decode_handled_into(raw, item, out, drop_axes)
            return
        super().decode_into(raw, item, out, drop_axes)

    def _decode_native(self, filtered: np.ndarray[Any, Any], spec: ArraySpec) -> Any:
        """The chunk's items through the native stages, or None when a
        stage refuses them (zarr's filters then run)."""
        data: Any = filtered
        for stage_ in (self.stages or ())[::-1]:
            data = stage_.decode_flat(data)
            if data is None:
                return None
        dtype = spec.dtype.to_native_dtype()
        if data.nbytes != dtype.itemsize * math.prod(spec.shape):
            return None
        return data.view(dtype).reshape(spec.shape, order=spec.order)

    def _encode_native(self, array: NDBuffer, spec: ArraySpec) -> Any:
        """The filtered items of a chunk by the native stages, or None."""
        data: Any = array.as_ndarray_like()
        if type(data) is not np.ndarray:
            return None
        data = np.ravel(data.astype(spec.dtype.to_native_dtype(), copy=False), order=spec.order)
        for stage_ in self.stages or ():
            data = stage_.encode_flat(data)
            if data is None:
                return None
        return data

    def _derive_tail_spec(self, spec: ArraySpec) -> ArraySpec | None:
        why_not, count, itemsize = v2_filtered_layout(self.all_filters, spec)
        if why_not or itemsize != self.tail.dtype.itemsize:
            return None
        flat = _flat_spec(spec, count, itemsize)
        return flat if self.tail.handles(flat) else None

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer:
        flat = self._tail_spec(spec)
        if flat is None:
            return self.fallback.decode(raw, spec)
        filtered = self.tail.decode_array(raw, flat, key).view(np.uint8)
        if self.stages is not None:
            native = self._decode_native(filtered, spec)
            if native is not None:
                return spec.prototype.nd_buffer.from_ndarray_like(native)
        raw = spec.prototype.buffer.from_array_like(filtered)
        decoded: NDBuffer = codec_decode_sync(self.filters, raw, spec)
        return decoded

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        flat = self._tail_spec(spec)
        if flat is None:
            return self.fallback.encode(array, spec)
        data = None
        if self.stages is not None:
            data = self._encode_native(array, spec)
        if data is None:
            filtered = codec_encode_sync(self.filters, array, spec)
            assert filtered is not None
            data = filtered.as_numpy_array()
        if data.nbytes != flat.shape[0] * self.tail.dtype.itemsize:
            # the filters made another size than their parameters say
            return self.fallback.encode(array, spec)
        values = data.view(self.tail.dtype)
        return self.tail.encode(flat.prototype.nd_buffer.from_ndarray_like(values), flat, key)


def v2_stages(filters: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The native stages of a format-2 array's numcodecs ``filters`` (a
    ``Shuffle`` is `V2Shuffle`), in their order, or None when one of them
    has no kernel."""
    stages: list[Any] = []
    for codec in filters:
        found: tuple[Any, ...] | None
        if type(codec) is Shuffle:
            found = (V2Shuffle(codec.elementsize),)
        else:
            found = v2_native_stages((codec,))
        if found is None:
            return None
        stages.extend(found)
    return tuple(stages)


def _v2_fused_tail(
    codec: V2Codec, chain: V2HybridChain, spec: ArraySpec, native_tail: NativeTail
) -> NativeChain | None:
    """The chain's tail over items of the size its native stages encode
    to: a tail that unshuffles a last ``Shuffle`` takes bytes, the batch
    kernels take the stages' items (the same bytes, unshuffled in the
    kernel by their size)."""
    head = chain.filters.filters or ()
    why_not, count, itemsize = v2_filtered_layout(tuple(head), spec)
    if why_not:
        return None
    if itemsize == chain.tail.dtype.itemsize:
        return chain.tail
    rest = V2Codec(filters=chain.all_filters[len(head) :], compressor=codec.compressor)
    flat = _flat_spec(spec, count, itemsize)
    return native_tail((rest,), flat, "native chain declined this chunk")


def v2_fused(
    codec: V2Codec, chain: V2HybridChain, spec: ArraySpec, native_tail: NativeTail
) -> FilteredChain | None:
    """The native stages of a format-2 chain as the filters of a
    `FilteredChain` over its tail, or None when a stage has no kernel step.
    numcodecs filters a chunk's items in the array's order, which is the
    stored order: an F-order chunk's items are scattered transposed."""
    stages = chain.stages
    if not stages or filter_kernels is None or batch_kernels is None:
        return None
    tail = _v2_fused_tail(codec, chain, spec, native_tail)
    if tail is None:
        return None
    steps = []
    dtype = spec.dtype.to_native_dtype()
    for stage_ in stages:
        kernel_step = getattr(stage_, "kernel_step", None)  # a V2Shuffle has none
        step = None if kernel_step is None else kernel_step(dtype)
        if step is None:
            return None
        steps.append(step)
        dtype = stage_.encoded or dtype
    ndim = len(spec.shape)
    order = tuple(range(ndim - 1, -1, -1)) if spec.order == "F" and ndim > 1 else None
    try:
        fused = FilteredChain(spec, tuple(steps), tail, chain.fallback, order=order)
    except (TypeError, ValueError):  # a step the kernels refuse
        return None
    return fused if fused.filters.encoded_itemsize == tail.dtype.itemsize else None


def _v2_tail(
    codec: V2Codec, flat: ArraySpec, reason: str, native_tail: NativeTail
) -> tuple[tuple[Any, ...], NativeChain] | None:
    """(the filters run before it, the native tail): the compressor with a
    last ``Shuffle`` when its kernel takes both, else the compressor alone."""
    split = split_v2_shuffle(codec)
    if split is not None:
        tail = native_tail((split[1],), flat, reason)
        if tail is not None:
            return split[0], tail
    tail = native_tail((V2Codec(filters=None, compressor=codec.compressor),), flat, reason)
    return None if tail is None else (tuple(codec.filters or ()), tail)


def _v2_hybrid(
    codec: V2Codec, spec: ArraySpec, fallback: TransformChain, native_tail: NativeTail
) -> V2HybridChain | None:
    why_not, count, itemsize = v2_filtered_layout(codec.filters or (), spec)
    if why_not:
        return None
    flat = _flat_spec(spec, count, itemsize)
    filters = tuple(codec.filters or ())
    names = ", ".join(str(getattr(f, "codec_id", type(f).__name__)) for f in filters)
    reason = ""
    if v2_stages(filters) is None:  # a Shuffle always has a stage
        reason = (
            f"zarr format 2 filters ({names}) run zarr's code on each chunk (no native "
            "kernel); the compressor is native"
        )
    elif spec.order == "F" and len(spec.shape) > 1 and not v2_order_kept(filters):
        reason = (
            f"zarr format 2 filters ({names}) run zarr's code on each chunk (bitround "
            "stores an order-F chunk in C order); the compressor is native"
        )
    found = _v2_tail(codec, flat, reason or "native chain declined this chunk", native_tail)
    if found is None:
        return None
    chain = V2HybridChain(codec, found[0], found[1], fallback, reason)
    if chain.stages is not None:
        chain.fused = v2_fused(codec, chain, spec, native_tail)
    return chain


def _names(codecs: tuple[Codec, ...]) -> str:
    return ", ".join(type(c).__name__ for c in codecs if type(c) is not TransposeCodec)


def hybrid_chain(
    codecs: tuple[Codec, ...], spec: ArraySpec, fallback: TransformChain, native_tail: NativeTail
) -> HybridChain | V2HybridChain | None:
    """A `HybridChain` for ``codecs`` when the codecs after the Python stages
    run natively for the spec those stages resolve to (a `V2HybridChain`
    for a format-2 chunk with filters), else None. ``native_tail`` builds
    the native part (`zarr_fused._chain.native_tail`)."""
    if len(codecs) == 1 and type(codecs[0]) is V2Codec and codecs[0].filters:
        return _v2_hybrid(codecs[0], spec, fallback, native_tail)
    split = split_python_stages(codecs)
    if split == 0:
        return None
    stages, rest = codecs[:split], codecs[split:]
    # resolved once: resolving a stage's spec is not free, and zarr builds
    # the plan on every open_array
    specs = _stage_specs(stages, spec)
    inner_spec = specs[-1]
    run = tuple(stage(c, s) for c, s in zip(stages, specs, strict=False))
    python = tuple(
        r.codec for r in run if type(r) is PythonStage and type(r.codec) is not TransposeCodec
    )
    reason = ""
    if python:
        reason = (
            f"the array->array stages {_names(python)} run zarr's code on each decoded "
            "chunk (no native kernel); the rest of the chain is native"
        )
    tail = native_tail(rest, inner_spec, reason or "native chain declined this chunk")
    return None if tail is None else HybridChain(run, tail, fallback, reason)


class FilteredChain(BatchChain):
    """Native filters over a native tail, run by the batch kernels (see the
    module): what the shard engine needs of a chain (`NativeChain`'s
    batches, layouts and whole-chunk codec), for chunks of the value type.

    A chunk fixedscaleoffset cannot encode natively (a value its integer
    type cannot hold) is encoded by ``fallback``, zarr's code.
    """

    native = True
    reason = ""
    encodes_to_files = False

    def __init__(
        self,
        spec: ArraySpec,
        steps: tuple[Any, ...],
        tail: NativeChain,
        fallback: TransformChain,
        order: tuple[int, ...] | None = None,
    ) -> None:
        assert filter_kernels is not None
        self.spec = spec
        self.zdtype = spec.dtype
        self.dtype: np.dtype[Any] = spec.dtype.to_native_dtype()
        self.stored = self.dtype
        # the tail's transpose comes after the filters (see _plan); a
        # format-2 tail is flat, and ``order`` is its chunks' memory order
        self.order = self.transpose = tail.order if order is None else order
        self.tail = tail
        self.fallback = fallback
        self.filters = filter_kernels.FilterChain(steps, refusing=True)
        self._layouts: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    def kernel_batch(self, capacity: int, ndim: int, describe: Any = describe_chunk) -> Any:
        batch = batch_kernels.DecodeBatch(self.tail.kernel, capacity, ndim, describe)
        batch.set_filters(self.filters, self.decode_refused)
        return batch

    def encode_batch(
        self,
        capacity: int,
        ndim: int,
        describe: Any = describe_chunk,
        arena: np.ndarray[Any, Any] | None = None,
    ) -> Any:
        batch = batch_kernels.EncodeBatch(self.tail.kernel, capacity, ndim, describe, arena)
        batch.set_filters(self.filters, self.encode_refused)
        return batch

    def encode_bound(self, nbytes: int) -> int:
        """The most bytes a chunk of ``nbytes`` value bytes encodes to."""
        count = nbytes // self.dtype.itemsize
        return self.tail.encode_bound(count * self.filters.encoded_itemsize)

    def encode_swap(self, array: np.ndarray[Any, Any]) -> bool | None:
        """False for values of the chain's type (the batch swaps the
        filtered items itself); None for any other type."""
        return False if array.dtype == self.dtype else None

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        data = array.as_ndarray_like()
        if not self.handles(spec) or type(data) is not np.ndarray or data.shape != spec.shape:
            return self.fallback.encode(array, spec)
        if data.dtype != self.dtype:
            return self.fallback.encode(array, spec)
        batch = self.encode_batch(1, data.ndim)
        batch.add(data, self.layout(spec.shape), False, key)
        (encoded,) = batch.run()
        if encoded is False:
            return None
        return spec.prototype.buffer.from_array_like(encoded)


def _kernel_steps(stages: tuple[Codec, ...], specs: list[ArraySpec]) -> tuple[Any, ...] | None:
    """The `FilterChain` steps of ``stages`` on chunks of ``specs`` (the
    spec before each stage), or None when one of them has no kernel for the
    type it meets."""
    steps = []
    for codec, before in zip(stages, specs, strict=False):
        found = native_stage(codec)
        dtype = before.dtype.to_native_dtype()
        step = None if found is None or not dtype.isnative else found.kernel_step(dtype)
        if step is None:
            return None
        steps.append(step)
    return tuple(steps)


def filtered_chain(
    codecs: tuple[Codec, ...], spec: ArraySpec, fallback: TransformChain, native_tail: NativeTail
) -> FilteredChain | None:
    """A `FilteredChain` for ``codecs`` (leading filters with kernels, then
    a chain the native tail covers, with a transpose only after filters
    that keep no order), else None."""
    split = split_python_stages(codecs)
    if split == 0 or filter_kernels is None or batch_kernels is None:
        return None
    if any(type(c) is TransposeCodec for c in codecs[:split]):
        return None
    stages, rest = codecs[:split], codecs[split:]
    if any(native_stage(c) is None for c in stages):
        return None  # before resolving the stages' specs, which costs more
    specs = _stage_specs(stages, spec)
    steps = _kernel_steps(stages, specs)
    if steps is None:
        return None
    tail = native_tail(rest, specs[-1], "native chain declined this chunk")
    # a transpose after the filters: delta's running sum follows the items' order
    if tail is None or (tail.order is not None and any(s[0] == "delta" for s in steps)):
        return None
    try:
        return FilteredChain(spec, steps, tail, fallback)
    except (TypeError, ValueError):  # a step the kernels refuse
        return None
