"""The unsharded chunk paths: `read` (fetch, decode, scatter) and `write`
(fetch what a write covers in part, merge, encode, store), each with a
native reader/writer and zarr's-code twins for chains without kernels."""
