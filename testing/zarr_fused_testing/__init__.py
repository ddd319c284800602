"""The servers, clusters and data zarr_fused is tested and measured against.

A development package, never part of what users install: tests/ and
asv_bench/ both start their object-store servers (`zarr_fused_testing.s3`,
`zarr_fused_testing.s3_static`) and Dask clusters
(`zarr_fused_testing.cluster`) from here, and take the codec chains real
datasets use (`zarr_fused_testing.chains`) from here, so the benchmarks
measure what the tests check without reaching into the tests' directory.
``make bootstrap`` installs it, editable, into the project's venv. Only
`zarr_fused_testing.chains` imports zarr (its codecs); nothing here imports
zarr_fused.
"""
