"""The IO layer: how the chunk and shard paths get bytes and store them.

The paths ask it for whole keys and byte ranges, batched, and hand it bytes
to store. Local files are read and written natively through `_localio` (`local`; `stores` finds
the stores that are local files under another name), `engine` keeps many
requests in flight on IO threads where the files answer slowly, `full`
retries writes with fewer files in flight on a full disk, `shard_lock`
holds a shard while a write updates part of it (record locks on local
files, in-process holds elsewhere) and `object_cas` stores by conditional
PUT on object stores. Every other store is reached through zarr's own byte
getters and setters.
"""
