"""Codec kernels: zarr_fused's native batch kernels against numcodecs, on
the same payloads, with a serial (1 thread) and a 2-thread variant."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ._peers import THREADS, choose

N_CHUNKS = 128
CHUNK_BYTES = 64 * 1024

CODECS = {
    "zstd-1": ({"id": "zstd", "level": 1}, {"compressor": "zstd", "level": 1}),
    "blosc-lz4-shuffle": (
        {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "typesize": 4},
        {"compressor": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4},
    ),
    "gzip-1": ({"id": "gzip", "level": 1}, {"compressor": "gzip", "level": 1}),
}


def _payloads(codec: str) -> tuple[Any, Any, list[bytes], list[bytes], np.ndarray]:
    import numcodecs
    import numcodecs.blosc

    # as zarr sets it: numcodecs' blosc must not spawn its own threads
    numcodecs.blosc.use_threads = False
    try:
        from zarr_fused import _codecs as kc
    except ImportError as exc:  # asv skips the benchmark
        raise NotImplementedError(str(exc)) from exc
    config, params = CODECS[codec]
    nc = numcodecs.get_codec(dict(config))
    kernel = kc.ChainKernel(itemsize=4, **params)
    items = CHUNK_BYTES // 4
    x = np.linspace(0, 50, N_CHUNKS * items)
    data = (np.sin(x) * 1000 + np.random.default_rng(0).normal(0, 1, x.size)).astype("<f4")
    raw = [data[i * items : (i + 1) * items].tobytes() for i in range(N_CHUNKS)]
    encoded = [nc.encode(r) for r in raw]
    return nc, kernel, raw, encoded, data


class CodecKernels:
    params = (choose(list(CODECS), ["zstd-1"]), ["native", "numcodecs"], THREADS)
    param_names = ("codec", "implementation", "threads")

    def setup(self, codec: str, implementation: str, threads: int) -> None:
        try:
            from zarr_fused import _codec_batch as kc
        except ImportError:  # commits before the batches had their own module
            from zarr_fused import _codecs as kc

        self.nc, self.kernel, self.raw, self.encoded, self.data = _payloads(codec)
        self.items = CHUNK_BYTES // 4
        self.dest = np.empty(N_CHUNKS * self.items, dtype="<f4")
        self.layout = kc.ChunkLayout((self.items,), 4, None)
        # encoded chunks go to a reused buffer, as the sharded writer does
        self.bound = self.kernel.max_encoded_size(CHUNK_BYTES)
        self.arena = np.empty(N_CHUNKS * self.bound, dtype=np.uint8)
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self.threads = threads
        self.kc = kc
        # checked once, untimed
        self.time_decode(codec, implementation, threads)
        if not np.array_equal(self.dest, self.data):
            raise AssertionError(f"{implementation} decoded wrong data")
        if implementation == "native":  # what time_encode produces decodes to the data
            batch = kc.EncodeBatch(self.kernel, N_CHUNKS, 1, repr, self.arena)
            for i in range(N_CHUNKS):
                batch.add(self.data[i * self.items : (i + 1) * self.items], self.layout, False, i)
            if [bytes(self.nc.decode(bytes(p))) for p in batch.run()] != list(self.raw):
                raise AssertionError("native encoded wrong data")

    def teardown(self, *args: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def _split(self, fn: Any) -> None:
        if self.pool is None:
            fn(0, N_CHUNKS)
        else:
            step = -(-N_CHUNKS // self.threads)
            list(
                self.pool.map(lambda lo: fn(lo, min(N_CHUNKS, lo + step)), range(0, N_CHUNKS, step))
            )

    def time_decode(self, codec: str, implementation: str, threads: int) -> None:
        items = self.items
        if implementation == "native":

            def part(lo: int, hi: int) -> None:
                batch = self.kc.DecodeBatch(self.kernel, hi - lo, 1)
                for i in range(lo, hi):
                    batch.add(
                        self.encoded[i],
                        self.layout,
                        (),
                        self.dest,
                        (slice(i * items, (i + 1) * items),),
                        (),
                        i,
                    )
                batch.run()
        else:

            def part(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    self.nc.decode(self.encoded[i], out=self.dest[i * items : (i + 1) * items])

        self._split(part)

    def time_encode(self, codec: str, implementation: str, threads: int) -> None:
        items = self.items
        if implementation == "native":

            def part(lo: int, hi: int) -> None:
                batch = self.kc.EncodeBatch(
                    self.kernel, hi - lo, 1, repr, self.arena[lo * self.bound : hi * self.bound]
                )
                for i in range(lo, hi):
                    batch.add(self.data[i * items : (i + 1) * items], self.layout, False, i)
                batch.run()
        else:

            def part(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    self.nc.encode(self.raw[i])

        self._split(part)


class Crc32c:
    params = (("native", "google_crc32c"),)
    param_names = ("implementation",)

    def setup(self, implementation: str) -> None:
        self.blob = np.random.default_rng(0).bytes(16 * 2**20)
        if implementation == "native":
            try:
                from zarr_fused._codecs import crc32c
            except ImportError as exc:
                raise NotImplementedError(str(exc)) from exc
            self.fn = crc32c
        else:
            import google_crc32c

            self.fn = google_crc32c.value

    def time_crc32c_16MiB(self, implementation: str) -> None:
        self.fn(self.blob)
