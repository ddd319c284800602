"""Values that look like what filter chains are used for (`values_of`, from
`zarr_fused_testing.chains`), and the set-up the filter tests share
(unsharded, sharded, format 2, cast_value): the same writes through
zarr_fused and through zarr's `BatchedCodecPipeline`, then each store read
by both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import zarr
from zarr.codecs import BytesCodec, ShardingCodec
from zarr.codecs import numcodecs as znc
from zarr_fused_testing.chains import values_of  # noqa: F401 (the filter tests import it here)

from helpers import BATCHED, FUSED, assert_same_values

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}
ZARR = {"codec_pipeline.path": BATCHED}


def astype_chain(
    decoded: str, encoded: str, values: str, fill: Any
) -> tuple[Callable[[], list[Any]], str, str, Any]:
    """An entry of the sharded filter tests' chain tables (filters, dtype,
    how values are drawn, fill value): numcodecs' ``AsType`` storing the
    ``decoded`` items as ``encoded``."""
    return (lambda: [znc.AsType(encode_dtype=encoded, decode_dtype=decoded)], decoded, values, fill)


def filter_array(
    store: Any,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: str,
    fill_value: Any,
    filters: list[Any],
    compressors: list[Any],
    inner: tuple[int, ...] | None = None,
    index_location: str = "end",
    overwrite: bool = False,
) -> Any:
    """A format-3 array whose chain is ``filters``, bytes, ``compressors``:
    in chunks of ``chunks``, or, given ``inner``, in shards of ``chunks``
    whose inner chunks of ``inner`` carry the whole chain."""
    if inner is None:
        codecs: dict[str, Any] = {"filters": filters, "compressors": compressors}
    else:
        serializer = ShardingCodec(
            chunk_shape=inner,
            codecs=[*filters, BytesCodec(), *compressors],
            index_location=index_location,
        )
        codecs = {"serializer": serializer, "filters": None, "compressors": None}
    return zarr.create_array(
        store,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        fill_value=fill_value,
        overwrite=overwrite,
        **codecs,
    )


def write_both(
    make: Callable[[str], Any],
    write: Callable[[Any], None],
    fused: Mapping[str, Any] = STRICT,
) -> dict[str, Any]:
    """``make(who)`` creates an array in a fresh store and ``write(array)``
    writes into it, once with zarr_fused configured (``fused``: strict
    unless told otherwise; ``who`` is "fused") and once with zarr's
    `BatchedCodecPipeline` ("zarr"). Returns the two stores by ``who``."""
    stores = {}
    for who, config in (("fused", fused), ("zarr", ZARR)):
        with zarr.config.set(dict(config)):
            array = make(who)
            write(array)
            stores[who] = array.store
    return stores


def assert_reads_as_zarr(
    stores: dict[str, Any],
    selection: Any,
    check: Callable[[Any], None] | None = None,
) -> None:
    """Each store read whole and at ``selection`` by zarr_fused (strict)
    gives what zarr reads from it; ``check`` sees each array zarr_fused
    opened (its plan, say) before the reads."""
    for store in stores.values():
        with zarr.config.set(ZARR):
            expected = zarr.open_array(store, mode="r")
            expected_all, expected_part = expected[...], expected[selection]
        with zarr.config.set(STRICT):
            array = zarr.open_array(store, mode="r")
            if check is not None:
                check(array)
            assert_same_values(array[...], expected_all)
            assert_same_values(array[selection], expected_part)
