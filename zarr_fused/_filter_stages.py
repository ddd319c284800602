"""Array->array stages of a hybrid chain that run native kernels.

A hybrid chain runs each of its stages with three methods,
``resolve_metadata``, ``decode`` and ``encode`` (a chunk and its spec
before the stage). `stage` gives the one for a zarr codec: a native stage
whose work runs in `zarr_fused._filters` with the GIL released where there
is a kernel (`native_stage`), else a `PythonStage` running zarr's own code.
A chunk a kernel cannot take (another data type or byte order than the
codec's own, a non-NumPy buffer, an empty chunk) goes through zarr's
codec, which is the reference.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numcodecs
import numpy as np
from zarr.codecs.cast_value import CastValue
from zarr.codecs.numcodecs import AsType, BitRound, Delta, FixedScaleOffset, Quantize
from zarr.codecs.scale_offset import ScaleOffset
from zarr.core.dtype import get_data_type_from_native_dtype

from zarr_fused._native import cast_kernels, filter_kernels
from zarr_fused._zarr_compat import codec_decode_sync, codec_encode_sync

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

__all__ = [
    "NativeAsType",
    "NativeBitRound",
    "NativeCastValue",
    "NativeDelta",
    "NativeFixedScaleOffset",
    "NativeQuantize",
    "NativeScaleOffset",
    "PythonStage",
    "native_stage",
    "quantize_scale",
    "stage",
    "v2_native_stages",
]

#: (kind, item size) pairs the delta kernel covers
_DELTA_TYPES = {("i", n) for n in (1, 2, 4, 8)} | {("u", n) for n in (1, 2, 4, 8)}
_DELTA_TYPES |= {("f", 4), ("f", 8)}
#: mantissa bits of the float types numcodecs' BitRound takes
_BITROUND_MANTISSA = {("f", 2): 10, ("f", 4): 23, ("f", 8): 52}


class PythonStage:
    """A zarr codec run with its own synchronous code."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec

    def resolve_metadata(self, spec: ArraySpec) -> ArraySpec:
        resolved: ArraySpec = self.codec.resolve_metadata(spec)
        return resolved

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        decoded: NDBuffer = codec_decode_sync(self.codec, chunk, spec)
        return decoded

    def encode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer | None:
        encoded: NDBuffer | None = codec_encode_sync(self.codec, chunk, spec)
        return encoded


class _NativeStage(PythonStage):
    """A stage run by a kernel of `zarr_fused._filters` on chunks it takes
    (a NumPy array of the data type before the stage when encoding, of the
    type after it when decoding, C-contiguous, not empty), by zarr's code
    on any other chunk, or when the kernel refuses the values."""

    #: the data type of the chunks before the stage (None: any the kernel takes)
    dtype: np.dtype[Any] | None = None
    #: the data type the stage encodes to (None: the same as the input)
    encoded: np.dtype[Any] | None = None

    def _takes(self, data: Any, dtype: np.dtype[Any] | None) -> bool:
        return type(data) is np.ndarray and data.size > 0 and data.dtype == (dtype or data.dtype)

    def takes_dtype(self, dtype: np.dtype[Any]) -> bool:
        """Whether the stage runs natively on chunks of ``dtype`` (the type
        before it); a stage that says no runs zarr's code for the array."""
        return True

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        """This stage as a step of `zarr_fused._filters.FilterChain` on items
        of ``dtype`` (the chunk's type before the stage), or None when the
        kernel does not take that type."""
        return None

    def _decode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        """Decode ``data`` into ``out``; False when the kernel refuses it."""
        raise NotImplementedError

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        """Encode ``data`` into ``out``; False when the kernel refuses it."""
        raise NotImplementedError

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        data: Any = chunk.as_ndarray_like()
        # numcodecs flattens in the array's own order ("A"): a chunk in
        # another layout than C order goes through its code
        if not self._takes(data, self.encoded) or not data.flags.c_contiguous:
            return super().decode(chunk, spec)
        out = np.empty(spec.shape, dtype=self.dtype or data.dtype)
        if out.size != data.size or not self._decode_into(data, out):
            return super().decode(chunk, spec)
        return spec.prototype.nd_buffer.from_ndarray_like(out)

    def encode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer | None:
        data: Any = chunk.as_ndarray_like()
        if not self._takes(data, self.dtype):
            return super().encode(chunk, spec)
        # C order, as zarr's wrapper flattens it before numcodecs does
        data = np.ascontiguousarray(data)
        out = np.empty(data.shape, dtype=self.encoded or data.dtype)
        if not self._encode_into(data, out):
            return super().encode(chunk, spec)
        return spec.prototype.nd_buffer.from_ndarray_like(out)

    def encode_flat(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """numcodecs' encoding of a C-contiguous chunk of a format-2 array
        (as ``V2Codec`` hands it to its filters), or None when the kernel
        does not take it."""
        if not self._takes(data, self.dtype) or not data.flags.c_contiguous:
            return None
        out = np.empty(data.shape, dtype=self.encoded or data.dtype)
        return out if self._encode_into(data, out) else None

    def decode_flat(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """numcodecs' decoding of a chunk's filtered items (1-d), or None
        when the kernel does not take them."""
        if self.encoded is not None:
            if data.nbytes % self.encoded.itemsize:
                return None
            data = data.view(self.encoded)
        if not self._takes(data, self.encoded):
            return None
        out = np.empty(data.shape, dtype=self.dtype or data.dtype)
        return out if self._decode_into(data, out) else None


class _EncodeOnly(_NativeStage):
    """A lossy stage whose decoding returns the chunk as it is (numcodecs'
    ``BitRound`` and ``Quantize`` without ``astype``)."""

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        data: Any = chunk.as_ndarray_like()
        if self._takes(data, self.dtype) and data.shape == spec.shape:
            return chunk
        return PythonStage.decode(self, chunk, spec)

    def decode_flat(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        return data  # numcodecs returns the items as they are


class NativeDelta(_NativeStage):
    """``numcodecs.delta``, with ``astype`` equal to ``dtype`` or another
    integer type for integers, float32 for float64, run by
    `zarr_fused._filters.delta`; a chunk whose first value ``astype``
    cannot hold (NumPy refuses it) runs numcodecs' code."""

    def __init__(self, codec: Any, dtype: np.dtype[Any], encoded: np.dtype[Any]) -> None:
        super().__init__(codec)
        self.dtype, self.encoded = dtype, encoded

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        return ("delta", dtype, self.encoded) if dtype == self.dtype else None

    def _decode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        return filter_kernels.delta(data, out, False) == filter_kernels.FilterStatus.FILTER_OK

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        return filter_kernels.delta(data, out, True) == filter_kernels.FilterStatus.FILTER_OK


class NativeFixedScaleOffset(_NativeStage):
    """``numcodecs.fixedscaleoffset`` from float32 or float64 to an integer
    type, run by `zarr_fused._filters`; a chunk with a value the integer
    type cannot hold (NaN among them) runs numcodecs' code."""

    def __init__(
        self, codec: Any, dtype: np.dtype[Any], encoded: np.dtype[Any], offset: float, scale: float
    ) -> None:
        super().__init__(codec)
        self.dtype, self.encoded = dtype, encoded
        self.offset, self.scale = offset, scale

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        if dtype != self.dtype:
            return None
        return ("fixedscaleoffset", dtype, self.encoded, self.offset, self.scale)

    def _decode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        filter_kernels.fixedscaleoffset_decode(data, out, self.offset, self.scale)
        return True

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        status = filter_kernels.fixedscaleoffset_encode(data, out, self.offset, self.scale)
        return status == filter_kernels.FilterStatus.FILTER_OK


class NativeBitRound(_EncodeOnly):
    """``numcodecs.bitround`` on native-order float16, float32 and float64
    chunks, run by `zarr_fused._filters.bitround`."""

    def __init__(self, codec: Any, keepbits: int) -> None:
        super().__init__(codec)
        self.keepbits = keepbits

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        mantissa = _BITROUND_MANTISSA.get((dtype.kind, dtype.itemsize))
        if mantissa is None or not dtype.isnative or not 0 <= self.keepbits < mantissa:
            return None
        return ("bitround", dtype, mantissa - self.keepbits)

    def _takes(self, data: Any, dtype: np.dtype[Any] | None) -> bool:
        return (
            super()._takes(data, dtype)
            and (data.dtype.kind, data.dtype.itemsize) in _BITROUND_MANTISSA
            and data.dtype.isnative
            and self.keepbits < _BITROUND_MANTISSA[data.dtype.kind, data.dtype.itemsize]
        )

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        mantissa = _BITROUND_MANTISSA[data.dtype.kind, data.dtype.itemsize]
        filter_kernels.bitround(data, out, mantissa - self.keepbits)
        return True


class NativeQuantize(_EncodeOnly):
    """``numcodecs.quantize`` without ``astype`` on float32 and float64,
    run by `zarr_fused._filters.quantize`."""

    def __init__(self, codec: Any, dtype: np.dtype[Any], scale: float) -> None:
        super().__init__(codec)
        self.dtype = self.encoded = dtype
        self.scale = scale

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        return ("quantize", dtype, self.scale) if dtype == self.dtype else None

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        filter_kernels.quantize(data, out, self.scale)
        return True


class NativeScaleOffset(_NativeStage):
    """zarr's ``scale_offset`` on native integer, float32 and float64
    chunks, run by `zarr_fused._filters.scale_offset`; its offset and scale
    are parsed by the data type, as zarr parses them. A chunk whose values
    zarr refuses (an integer result out of range, a remainder when
    decoding) runs zarr's code, which raises its error."""

    def _takes(self, data: Any, dtype: np.dtype[Any] | None) -> bool:
        return super()._takes(data, dtype) and _kernel_type(data.dtype) is not None

    def __init__(self, codec: Any) -> None:
        super().__init__(codec)
        # zarr's data type lookup costs more than the kernel on a chunk
        self._params: dict[np.dtype[Any], tuple[Any, Any] | None] = {}

    def params(self, dtype: np.dtype[Any]) -> tuple[Any, Any] | None:
        """(offset, scale) as ``dtype`` holds them (Python integers for an
        integer type), or None when zarr's parser refuses them (zarr's code
        then raises its own error)."""
        if dtype not in self._params:
            self._params[dtype] = self._parse(dtype)
        return self._params[dtype]

    def _parse(self, dtype: np.dtype[Any]) -> tuple[Any, Any] | None:
        zdtype = get_data_type_from_native_dtype(dtype)
        try:
            offset = zdtype.from_json_scalar(self.codec.offset, zarr_format=3)
            scale = zdtype.from_json_scalar(self.codec.scale, zarr_format=3)
        except (TypeError, ValueError, OverflowError):
            return None
        if dtype.kind in "iu":
            return (int(offset), int(scale)) if scale else None
        return float(offset), float(scale)

    def _run(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any], encode: bool) -> bool:
        assert filter_kernels is not None
        params = self.params(data.dtype)
        if params is None:
            return False
        status = filter_kernels.scale_offset(data, out, *params, encode)
        return status == filter_kernels.FilterStatus.FILTER_OK

    def _decode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        return self._run(data, out, False)

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        return self._run(data, out, True)

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        params = self.params(dtype) if _kernel_type(dtype) is not None else None
        return None if params is None else ("scale_offset", dtype, *params)


class NativeAsType(_NativeStage):
    """numcodecs' ``astype`` between any two of the integer types, float32
    and float64, run by `zarr_fused._filters.astype`; a chunk with a float
    an integer type cannot hold (NaN among them) runs numcodecs' code."""

    def __init__(self, codec: Any, dtype: np.dtype[Any], encoded: np.dtype[Any]) -> None:
        super().__init__(codec)
        self.dtype, self.encoded = dtype, encoded

    def _decode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        return filter_kernels.astype(data, out) == filter_kernels.FilterStatus.FILTER_OK

    def _encode_into(self, data: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
        assert filter_kernels is not None
        return filter_kernels.astype(data, out) == filter_kernels.FilterStatus.FILTER_OK

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        return ("astype", dtype, self.encoded) if dtype == self.dtype else None


class NativeCastValue(_NativeStage):
    """zarr's ``cast_value`` between the types `zarr_fused._cast_value` has
    (8- to 64-bit integers, float32, float64), run there; its two
    directions are built per type on the array side. A pair of types it
    lacks (float16, bfloat16, 4-bit integers...), a scalar map zarr's
    backend would refuse, and a chunk with a value the cast fails on run
    zarr's code, which raises its own error for that value."""

    def __init__(self, codec: Any) -> None:
        super().__init__(codec)
        self.stored: np.dtype[Any] = codec.dtype.to_native_dtype()
        self.encoded = self.stored
        self._specs: dict[tuple[np.dtype[Any], str], Any] = {}

    def spec(self, dtype: np.dtype[Any], direction: str) -> Any:
        """The `CastSpec` of one direction (``"encode"``, ``"decode"``) for
        arrays of ``dtype``, or None when the kernel does not take it."""
        key = (dtype, direction)
        if key not in self._specs:
            self._specs[key] = self._build(dtype, direction)
        return self._specs[key]

    def _build(self, dtype: np.dtype[Any], direction: str) -> Any:
        assert cast_kernels is not None
        src, dst = (dtype, self.stored) if direction == "encode" else (self.stored, dtype)
        entries = _cast_entries(self.codec, direction, src, dst)
        if entries is None:
            return None
        try:
            return cast_kernels.CastSpec(
                src, dst, self.codec.rounding, self.codec.out_of_range, entries
            )
        except (TypeError, ValueError):
            return None

    def takes_dtype(self, dtype: np.dtype[Any]) -> bool:
        both = self.spec(dtype, "encode") is not None and self.spec(dtype, "decode") is not None
        return dtype.isnative and both

    def _run(self, data: Any, dtype: np.dtype[Any], cast: Any) -> np.ndarray[Any, Any] | None:
        assert cast_kernels is not None
        if cast is None or type(data) is not np.ndarray or data.size == 0:
            return None
        # zarr's backend reads its input in C order, as this copy does
        out = np.empty(data.shape, dtype=dtype)
        if (
            cast_kernels.cast(np.ascontiguousarray(data), out, cast)
            != cast_kernels.CastStatus.CAST_OK
        ):
            return None  # zarr's code raises its error for the value
        return out

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        data: Any = chunk.as_ndarray_like()
        dtype = spec.dtype.to_native_dtype()
        ok = type(data) is np.ndarray and data.dtype == self.stored
        out = self._run(data, dtype, self.spec(dtype, "decode")) if ok else None
        if out is None:
            return PythonStage.decode(self, chunk, spec)
        return spec.prototype.nd_buffer.from_ndarray_like(out)

    def encode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer | None:
        data: Any = chunk.as_ndarray_like()
        ok = type(data) is np.ndarray and data.dtype == spec.dtype.to_native_dtype()
        out = self._run(data, self.stored, self.spec(data.dtype, "encode")) if ok else None
        if out is None:
            return PythonStage.encode(self, chunk, spec)
        return spec.prototype.nd_buffer.from_ndarray_like(out)

    def kernel_step(self, dtype: np.dtype[Any]) -> tuple[Any, ...] | None:
        encode, decode = self.spec(dtype, "encode"), self.spec(dtype, "decode")
        if encode is None or decode is None:
            return None
        return ("cast_value", dtype, encode, decode)


def _cast_entries(
    codec: Any, direction: str, src: np.dtype[Any], dst: np.dtype[Any]
) -> list[tuple[Any, Any]] | None:
    """The scalar map of one direction as zarr's ``cast_value`` hands it to
    its backend (keys and values made Python ints or floats by the source
    and target types, later equal keys overriding earlier ones), or None
    when zarr's conversion raises (zarr's code then raises it)."""
    mapping = (codec.scalar_map or {}).get(direction)
    if mapping is None:
        return []
    to_src = int if np.issubdtype(src, np.integer) else float
    to_dst = int if np.issubdtype(dst, np.integer) else float
    try:
        return list({to_src(k): to_dst(v) for k, v in mapping.items()}.items())
    except (TypeError, ValueError, OverflowError):
        return None


def quantize_scale(digits: int) -> float:
    """The power of two numcodecs' ``Quantize`` multiplies by for ``digits``
    decimal digits: the smallest one at least ``10 ** digits``, after the
    precision is rounded outward to a power of ten."""
    exponent = math.log10(10.0**-digits)
    exponent = math.floor(exponent) if exponent < 0 else math.ceil(exponent)
    return 2.0 ** math.ceil(math.log2(10.0**-exponent))


def _float_kernel_type(dtype: Any) -> np.dtype[Any] | None:
    found = np.dtype(dtype)
    return found if found.kind == "f" and found.itemsize in (4, 8) and found.isnative else None


def _kernel_type(dtype: Any) -> np.dtype[Any] | None:
    """``dtype`` when the kernels take it: a native integer, float32 or float64."""
    found = np.dtype(dtype)
    if found.kind in "iu" and found.isnative:
        return found
    return _float_kernel_type(found)


def _exact_scalar(value: Any, dtype: np.dtype[Any]) -> float | None:
    """``value`` (a Python number of a codec's configuration) as a float
    when NumPy's cast of it to ``dtype`` equals the kernels' (a finite
    float, or an integer both float types hold exactly), else None."""
    if type(value) is int and abs(value) <= 2**24:
        return float(value)
    if type(value) is not float or not math.isfinite(value):
        return None
    return value if dtype.itemsize == 8 or abs(value) < 1e38 else None


def _fixedscaleoffset(codec: Any, config: dict[str, Any]) -> NativeFixedScaleOffset | None:
    dtype = _float_kernel_type(config["dtype"])
    encoded = np.dtype(config.get("astype") or config["dtype"])
    if dtype is None or encoded.kind not in "iu" or not encoded.isnative:
        return None
    offset = _exact_scalar(config.get("offset", 0), dtype)
    scale = _exact_scalar(config.get("scale", 1), dtype)
    if offset is None or not scale:  # a zero scale divides by zero: zarr's warnings
        return None
    return NativeFixedScaleOffset(codec, dtype, encoded, offset, scale)


def _quantize(codec: Any, config: dict[str, Any]) -> NativeQuantize | None:
    dtype = _float_kernel_type(config["dtype"])
    if dtype is None or np.dtype(config.get("astype") or dtype) != dtype:
        return None
    scale = quantize_scale(config["digits"])
    if dtype.itemsize == 4 and not 2.0**-100 < scale < 2.0**100:
        return None  # NumPy's cast of the scale to float32 would not be exact
    return NativeQuantize(codec, dtype, scale)


def _delta(codec: Any, config: dict[str, Any]) -> NativeDelta | None:
    dtype = np.dtype(config["dtype"])
    astype = np.dtype(config.get("astype") or dtype)
    if (
        not (dtype.isnative and astype.isnative)
        or not {
            (dtype.kind, dtype.itemsize),
            (astype.kind, astype.itemsize),
        }
        <= _DELTA_TYPES
    ):
        return None
    # numcodecs' sums of uint64 and a signed type are float64 ones, and its
    # float32 sums to float64 another order of casts: no kernel for those
    if astype != dtype and (
        np.result_type(dtype, astype).kind not in "iu" + dtype.kind
        or (dtype.kind == "f") != (astype.kind == "f")
        or (dtype.kind == "f" and astype.itemsize > dtype.itemsize)
    ):
        return None
    return NativeDelta(codec, dtype, astype)


def _astype(codec: Any, config: dict[str, Any]) -> NativeAsType | None:
    if config.get("decode_dtype") is None:  # set once evolved for the array
        return None
    dtype = _kernel_type(config["decode_dtype"])
    encoded = _kernel_type(config["encode_dtype"])
    if dtype is None or encoded is None:
        return None
    return NativeAsType(codec, dtype, encoded)


def _scale_offset(codec: Any, config: dict[str, Any]) -> NativeScaleOffset:
    return NativeScaleOffset(codec)


def _bitround(codec: Any, config: dict[str, Any]) -> NativeBitRound:
    return NativeBitRound(codec, int(config["keepbits"]))


def _cast_value(codec: Any, config: dict[str, Any]) -> NativeCastValue | None:
    return None if cast_kernels is None else NativeCastValue(codec)


_NATIVE_STAGES: dict[type, Callable[[Any, dict[str, Any]], _NativeStage | None]] = {
    Delta: _delta,
    FixedScaleOffset: _fixedscaleoffset,
    BitRound: _bitround,
    Quantize: _quantize,
    AsType: _astype,
    ScaleOffset: _scale_offset,
    CastValue: _cast_value,
}


_V2_STAGES: dict[type, Callable[[Any, dict[str, Any]], _NativeStage | None]] = {
    numcodecs.AsType: _astype,
    numcodecs.Delta: _delta,
    numcodecs.FixedScaleOffset: _fixedscaleoffset,
    numcodecs.BitRound: _bitround,
    numcodecs.Quantize: _quantize,
    numcodecs.AsType: _astype,
}


def v2_native_stages(filters: Any) -> tuple[_NativeStage, ...] | None:
    """Native stages for a format-2 array's numcodecs ``filters``, in
    their order, or None when one of them has no kernel."""
    stages = []
    for codec in filters:
        make = _V2_STAGES.get(type(codec))
        found = None if make is None or filter_kernels is None else make(codec, codec.get_config())
        if found is None:
            return None
        stages.append(found)
    return tuple(stages)


def native_stage(codec: Codec, spec: ArraySpec | None = None) -> _NativeStage | None:
    """The native stage that runs ``codec``, or None when there is none
    (for chunks of ``spec``, the spec before the stage, when given)."""
    make = _NATIVE_STAGES.get(type(codec))
    if filter_kernels is None or make is None:
        return None
    config: dict[str, Any] = getattr(codec, "codec_config", {})
    found = make(codec, dict(config))
    if found is not None and spec is not None:
        # a type the stage lacks runs zarr's code for the whole array, so
        # the plan logs it and strict mode refuses it
        return found if found.takes_dtype(spec.dtype.to_native_dtype()) else None
    return found


def stage(codec: Codec, spec: ArraySpec | None = None) -> PythonStage:
    """How a hybrid chain runs ``codec`` (on chunks of ``spec``, the spec
    before the stage, when given): natively where it can."""
    return native_stage(codec, spec) or PythonStage(codec)
