"""The shard engine: `index` (the shard index format: its size, the missing
entry, loading and checking it), `read` (planned inner-chunk decodes through
the index), `write` (inner chunks encoded in parallel, shards assembled
natively) and `buffers` (shard-sized byte buffers reused across both)."""
