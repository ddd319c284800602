"""Unsharded chunk reads from a LocalStore, IO pipelined with decoding.

`PipelinedChunkReader` serves the same batches as
`zarr_fused._read.NativeChunkReader`, for arrays whose chunks are files of
one `zarr.storage.LocalStore`: the IO threads of `zarr_fused._io_engine`
read groups of chunk files (``open`` + ``pread``, with the GIL released)
into a buffer per group, and a compute thread decodes each group straight
into the output as soon as its files are in. With ``io_concurrency``
requests in flight, a filesystem whose every call is a round trip no longer
holds the decoding back to one request per compute thread.

Everything else (other stores, outputs the kernels cannot write into
directly, ``io_concurrency`` of 1) goes to `NativeChunkReader` unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_fused._io_engine import Batch, resolve_io_concurrency, run_pipelined
from zarr_fused._native import io_kernels
from zarr_fused._output import fill_missing
from zarr_fused._read import MISSING, PRESENT, NativeChunkReader, fill_pattern, local_files

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import GetResult
    from zarr.core.buffer import NDBuffer

    from zarr_fused._chain import NativeChain
    from zarr_fused._read import ReadItem

__all__ = ["PipelinedChunkReader", "group_size"]

#: most chunk files one IO request reads (one after another, in one IO thread)
MAX_GROUP = 16
#: most stored bytes (by the encoded size bound) one IO request reads
MAX_GROUP_BYTES = 4 << 20


def group_size(n: int, io_concurrency: int, bound: int) -> int:
    """Chunk files per IO request for ``n`` chunks of at most ``bound`` bytes.

    About four requests per IO thread, so the requests that finish first
    are decoded while the last ones are still in flight and uneven latencies
    balance out; several files per request where there are many, so a hot
    page cache does not pay the hand-off between threads for every file.
    """
    size = -(-n // (4 * io_concurrency))
    size = min(size, MAX_GROUP, max(1, MAX_GROUP_BYTES // max(1, bound)))
    return max(1, size)


@dataclass(frozen=True, slots=True)
class _Fetched:
    """The files of one request: their bytes in ``arena`` (file i at
    ``offsets[i]``, ``lengths[i]`` long, -1 when missing); files larger than
    their bound in ``oversize``."""

    arena: np.ndarray
    lengths: list[int]
    oversize: dict[int, bytes]


class PipelinedChunkReader:
    """Whole-chunk reads of LocalStore chunk files, IO apart from decoding."""

    def __init__(self, chain: NativeChain) -> None:
        self.chain = chain
        self.direct = NativeChunkReader(chain)

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[GetResult, ...]:
        chain = self.chain
        dst = out.as_ndarray_like()
        io_concurrency = resolve_io_concurrency()
        prefix = local_files(batch) if io_concurrency > 1 and io_kernels is not None else None
        if prefix is None or not chain.writes_into(dst, batch[0][1]):
            return self.direct.read(batch, out, drop_axes, max_workers)
        read_into = io_kernels.read_into  # type: ignore[union-attr]
        pattern = fill_pattern(batch[0][1], dst.dtype)
        ndim = max(dst.ndim, len(batch[0][1].shape))
        statuses: list[GetResult] = [MISSING] * len(batch)
        paths = [prefix + os.fsencode(item[0].path) for item in batch]
        bounds = [chain.encode_bound(chain.layout(item[1].shape).nbytes) for item in batch]
        size = group_size(len(batch), io_concurrency, max(bounds))
        groups = [range(s, min(len(batch), s + size)) for s in range(0, len(batch), size)]
        costs = [sum(bounds[i] for i in g) for g in groups]

        def fetch(group: range, state: Batch[range, _Fetched]) -> _Fetched:
            arena = np.empty(sum(bounds[i] for i in group), dtype=np.uint8)
            lengths: list[int] = []
            oversize: dict[int, bytes] = {}
            offset = 0
            for i in group:
                if state.stopped:
                    break
                got = read_into(paths[i], arena[offset:offset + bounds[i]])
                if got < -1:  # larger than any chunk we would write: read it whole
                    whole = io_kernels.read_whole(paths[i])  # type: ignore[union-attr]
                    got = -1 if whole is None else len(whole)
                    if whole is not None:
                        oversize[i] = whole
                lengths.append(got)
                offset += bounds[i]
            return _Fetched(arena, lengths, oversize)

        def consume(group: range, fetched: _Fetched) -> None:
            decode = chain.decode_batch(len(group), ndim)
            decode.set_fill(pattern)
            general: list[tuple[int, Any]] = []  # chunks the kernels cannot select
            offset = 0
            for i, length in zip(group, fetched.lengths, strict=True):
                getter, spec, chunk_selection, out_selection, _ = batch[i]
                payload = None
                if length < 0:
                    queued = decode.add_missing(dst, out_selection, getter)
                else:
                    statuses[i] = PRESENT
                    payload = fetched.oversize.get(i)
                    if payload is None:
                        payload = fetched.arena[offset:offset + length]
                    queued = decode.add(payload, chain.layout(spec.shape), chunk_selection, dst,
                                        out_selection, drop_axes, getter)
                if not queued:
                    general.append((i, payload))
                offset += bounds[i]
            decode.run()
            for i, payload in general:
                getter, spec, chunk_selection, out_selection, _ = batch[i]
                if payload is None:
                    fill_missing(out, out_selection, spec)
                else:
                    raw = spec.prototype.buffer.from_bytes(bytes(payload))
                    chain.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes,
                                      getter)

        run_pipelined(groups, costs, fetch, consume, io_concurrency=io_concurrency,
                      max_workers=max_workers)
        return tuple(statuses)
