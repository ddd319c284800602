"""The IO layer: how the chunk and shard paths get bytes and store them.

Today that is local files, read and written natively through `_localio`
(`local`), and fsspec's local filesystem served as a `LocalStore`
(`stores`); `shard_lock` holds a shard while a write updates part of it
(record locks on local files, in-process holds elsewhere); every other store is reached through zarr's own byte getters
and setters. This package is the seam where the latency-tolerant IO engine
(issue 14) and async stores (issue 15) plug in: the paths ask it for whole
keys and byte ranges, batched, and hand it bytes to store.
"""
