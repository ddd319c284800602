"""Plans: which chains run natively, strict mode, fallback logging, errors."""

from __future__ import annotations

import logging
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.codecs.numcodecs import BZ2, LZ4, Shuffle
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_utils import ChunkTransform
from zarr.errors import ZarrUserWarning

import zarr_fused
from zarr_fused.errors import CorruptChunkError, UnsupportedError

from helpers import FUSED, assert_same_values, make_store, run_in_python, with_pipeline


def _array(store: Any, **kwargs: Any) -> zarr.Array:
    kwargs.setdefault("shape", (10, 6))
    kwargs.setdefault("chunks", (4, 4))
    kwargs.setdefault("dtype", "<f8")
    return zarr.create_array(store, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "native"),
    [
        pytest.param({"compressors": None}, True, id="bytes"),
        pytest.param(
            {"compressors": None, "serializer": BytesCodec(endian="big")}, True, id="bytes-big"
        ),
        pytest.param({"compressors": None, "dtype": "bool"}, True, id="bytes-bool"),
        pytest.param({"compressors": ZstdCodec(level=1)}, True, id="zstd"),
        pytest.param({"compressors": GzipCodec(level=1)}, True, id="gzip"),
        pytest.param({"compressors": BloscCodec(cname="lz4")}, True, id="blosc"),
        pytest.param({"compressors": [ZstdCodec(), Crc32cCodec()]}, True, id="zstd-crc32c"),
        pytest.param({"compressors": [Crc32cCodec(), ZstdCodec()]}, True, id="crc32c-zstd"),
        pytest.param(
            {"compressors": None, "filters": [TransposeCodec(order=(1, 0))]}, True, id="transpose"
        ),
        pytest.param({"compressors": None, "dtype": "<U4"}, True, id="unicode"),
        pytest.param({"compressors": [ZstdCodec(), GzipCodec()]}, False, id="two-compressors"),
        pytest.param({"compressors": LZ4(acceleration=2)}, True, id="numcodecs-lz4"),
        pytest.param(
            {"compressors": [Shuffle(elementsize=4), LZ4()]}, True, id="numcodecs-shuffle-lz4"
        ),
        pytest.param({"compressors": Shuffle()}, False, id="numcodecs-shuffle-alone"),
        pytest.param({"compressors": BZ2(level=1)}, False, id="numcodecs-bz2"),
        pytest.param({"compressors": None, "dtype": str}, True, id="vlen-str"),
        pytest.param({"compressors": BZ2(level=1), "dtype": str}, False, id="vlen-str-bz2"),
    ],
)
@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
def test_chain_kind(fused: None, kwargs: dict[str, Any], native: bool) -> None:
    plan = _array({}, **kwargs)._async_array.codec_pipeline.plan
    assert plan.chain.native is native
    assert (plan.fallback == "") is native
    if not native:
        assert plan.fallback  # a reason is recorded


NATIVE_CHAINS = {
    "bytes": {"compressors": None},
    "bytes-big": {"compressors": None, "serializer": BytesCodec(endian="big")},
    "zstd": {"compressors": ZstdCodec(level=1)},
    "gzip": {"compressors": GzipCodec(level=1)},
    "blosc": {"compressors": BloscCodec(cname="lz4", shuffle="shuffle")},
    "crc32c": {"compressors": [ZstdCodec(), Crc32cCodec()]},
    "transpose": {"compressors": ZstdCodec(), "filters": [TransposeCodec(order=(1, 0))]},
}


@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
@pytest.mark.parametrize("chain", [pytest.param(v, id=k) for k, v in NATIVE_CHAINS.items()])
def test_native_chain_never_calls_chunk_transform(
    fused: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, chain: dict[str, Any], kind: str
) -> None:
    calls = []
    for name in ("decode_chunk", "encode_chunk"):
        real = getattr(ChunkTransform, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(ChunkTransform, name, spy)
    arr = _array(make_store(kind, tmp_path), fill_value=0.0, **chain)
    data = np.random.default_rng(0).random((10, 6))
    arr[...] = data
    arr[2:7, 1:5] = 0.5  # partial chunks: existing bytes are decoded and merged
    data[2:7, 1:5] = 0.5
    assert_same_values(arr[...], data)
    assert_same_values(arr[3:9:2, 5], data[3:9:2, 5])
    assert_same_values(arr.oindex[[1, 8], [0, 5]], data[np.ix_([1, 8], [0, 5])])
    assert calls == []

    # the spy is live: a non-native chain goes through it
    slow = _array({}, compressors=BZ2(level=1), dtype=str)
    slow[...] = "x"
    assert "encode_chunk" in calls


def test_native_compute_runs_off_the_event_loop(
    fused: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zarr's sync API drives one shared event loop; decoding and encoding
    on it would serialise every thread's reads (zarr's own test of this
    spies on ChunkTransform, which native chains never call)."""
    import asyncio

    from zarr_fused.chunks.read import NativeChunkReader
    from zarr_fused.chunks.write import NativeChunkWriter

    seen: dict[str, list[bool]] = {"read": [], "write": []}

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    for cls, method, kind in (
        (NativeChunkReader, "read", "read"),
        (NativeChunkWriter, "write", "write"),
    ):
        real = getattr(cls, method)

        def spy(self: Any, *args: Any, _real: Any = real, _kind: str = kind) -> Any:
            seen[_kind].append(on_loop())
            return _real(self, *args)

        monkeypatch.setattr(cls, method, spy)
    arr = _array({}, compressors=ZstdCodec(level=1))
    arr[:4, :4] = 1.0
    arr[...] = 2.0
    assert_same_values(arr[...], np.full((10, 6), 2.0))
    assert arr[0, 0] == 2.0
    assert seen["read"] and seen["write"]
    assert not any(seen["read"]) and not any(seen["write"])


def test_native_info_reports_codecs() -> None:
    info = zarr_fused.native_info()
    assert info["extensions"] == {
        "zarr_fused._scatter": True,
        "zarr_fused._localio": True,
        "zarr_fused._fileio": True,
        "zarr_fused._codecs": True,
        "zarr_fused._codec_batch": True,
        "zarr_fused._shard_index": True,
        "zarr_fused._shard": True,
        "zarr_fused._shard_local": True,
        "zarr_fused._cast_value": True,
        "zarr_fused._filters": True,
        "zarr_fused._vlen": True,
        "zarr_fused._region_plan": True,
    }
    assert set(info["codecs"]) == {
        "bytes",
        "transpose",
        "crc32c",
        "zstd",
        "gzip",
        "blosc",
        "vlen-utf8",
        "vlen-bytes",
        "cast_value",
    } | {
        f"numcodecs.{n}"
        for n in (
            "zlib",
            "gzip",
            "lz4",
            "shuffle",
            "delta",
            "fixedscaleoffset",
            "quantize",
            "bitround",
            "vlen-utf8",
            "vlen-bytes",
        )
    }
    assert {"zstd", "zlib", "blosc", "lz4", "crc32c"} <= set(info["libraries"])


# -- strict mode and fallback logging -------------------------------------------------


def test_strict_mode_raises_for_non_native_chain(fused: None) -> None:
    arr = _array({}, compressors=BZ2(level=1))
    with zarr.config.set({"codec_pipeline.strict": True}):
        with pytest.raises(UnsupportedError, match="BZ2"):
            arr[...] = 1.0
        with pytest.raises(UnsupportedError, match="BZ2"):
            arr[...]
    arr[...] = 1.0  # strict off again: falls back
    assert_same_values(arr[...], np.ones((10, 6)))


def test_strict_mode_allows_native_chain(fused: None) -> None:
    arr = _array({}, compressors=None)
    with zarr.config.set({"codec_pipeline.strict": True}):
        arr[...] = 2.0
        assert_same_values(arr[...], np.full((10, 6), 2.0))


def test_strict_mode_by_environment_variable(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import zarr, numpy as np
        from zarr.codecs.numcodecs import BZ2
        a = zarr.create_array({}, shape=(4,), chunks=(2,), dtype=str, compressors=BZ2(level=1))
        try:
            a[:] = "x"
        except Exception as exc:
            print(type(exc).__name__)
        """
    )
    env = {
        "ZARR_CODEC_PIPELINE__PATH": FUSED,
        "ZARR_CODEC_PIPELINE__STRICT": "True",
        "PATH": "/usr/bin:/bin",
    }
    out = run_in_python("-c", script, env=env, check=True)
    assert out.stdout.strip() == "UnsupportedError"


def test_invalid_strict_value_warns_and_falls_back(fused: None) -> None:
    arr = _array({}, compressors=BZ2(level=1))
    with (
        zarr.config.set({"codec_pipeline.strict": "maybe"}),
        pytest.warns(ZarrUserWarning, match="codec_pipeline.strict"),
    ):
        arr[...] = 3.0
    assert_same_values(arr[...], np.full((10, 6), 3.0))


def test_fallback_is_logged_with_reason(fused: None, caplog: pytest.LogCaptureFixture) -> None:
    arr = _array({}, compressors=BZ2(level=1))
    with caplog.at_level(logging.DEBUG, logger="zarr_fused"):
        arr[...] = 1.0
        arr[...]
    messages = [r.getMessage() for r in caplog.records if r.name == "zarr_fused"]
    assert any("write falls back" in m and "BZ2" in m for m in messages)
    assert any("read falls back" in m and "BZ2" in m for m in messages)


def test_async_path_is_logged(
    tmp_path: Path, fused: None, caplog: pytest.LogCaptureFixture
) -> None:
    arr = _array(make_store("nosync", tmp_path), compressors=None)
    with caplog.at_level(logging.DEBUG, logger="zarr_fused"):
        arr[...] = 1.0
        arr[...]
    messages = [r.getMessage() for r in caplog.records if r.name == "zarr_fused"]
    assert any("async path" in m for m in messages)


# -- corrupt stored bytes -----------------------------------------------------------


@pytest.mark.parametrize("nbytes", [0, 7, 8 * 16 - 1, 8 * 16 + 8], ids=lambda n: f"{n}B")
def test_wrong_size_chunk_raises_with_key(fused: None, nbytes: int) -> None:
    store = zarr.storage.MemoryStore()
    arr = _array(store, compressors=None)
    arr[...] = 1.0
    bad = default_buffer_prototype().buffer.from_bytes(b"\x01" * nbytes)
    zarr.core.sync.sync(store.set("c/1/0", bad))
    with pytest.raises(CorruptChunkError, match=rf"'c/1/0'.*{nbytes} bytes"):
        arr[...]
    with pytest.raises(CorruptChunkError, match=r"'c/1/0'"):
        arr[5, 0] = 2.0  # partial write decodes the existing chunk
    # the other chunks are still readable
    assert_same_values(arr[0:4, :], np.ones((4, 6)))


# -- the CodecPipeline interface -----------------------------------------------------


def test_batch_decode_encode_roundtrip(fused: None) -> None:
    arr = _array({}, compressors=None)
    pipeline = arr._async_array.codec_pipeline
    spec = pipeline.array_spec
    data = np.arange(16, dtype="<f8").reshape(4, 4)
    nd = default_buffer_prototype().nd_buffer.from_numpy_array(data)
    encoded = list(zarr.core.sync.sync(pipeline.encode([(nd, spec), (None, spec)])))
    assert encoded[1] is None
    assert encoded[0].to_bytes() == data.tobytes()
    decoded = list(zarr.core.sync.sync(pipeline.decode([(encoded[0], spec), (None, spec)])))
    assert decoded[1] is None
    assert_same_values(decoded[0].as_numpy_array(), data)


def test_registry_key_and_class() -> None:
    from zarr.registry import get_pipeline_class

    with with_pipeline(FUSED):
        assert get_pipeline_class() is zarr_fused.FusedCodecPipeline
    assert zarr_fused.FusedCodecPipeline.__module__ == "zarr_fused"
    assert issubclass(zarr_fused.FusedCodecPipeline, zarr.core.codec_pipeline.FusedCodecPipeline)


# -- discovery and robustness in fresh processes ------------------------------------


def _run(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_")}
    full_env.update(env)
    return run_in_python("-c", textwrap.dedent(script), env=full_env)


def test_selected_by_env_var_without_import() -> None:
    out = _run(
        """
        import sys, zarr, numpy as np
        assert "zarr_fused" not in sys.modules
        a = zarr.create_array({}, shape=(6,), chunks=(4,), dtype="i2", compressors=None)
        a[:] = np.arange(6)
        assert (a[:] == np.arange(6)).all()
        p = a._async_array.codec_pipeline
        print(type(p).__module__ + "." + type(p).__qualname__)
        """,
        ZARR_CODEC_PIPELINE__PATH=FUSED,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == FUSED


def test_missing_extensions_degrade_cleanly() -> None:
    """Without the compiled modules, zarr keeps working on every pipeline,
    zarr_fused says so once, and strict mode raises."""
    out = _run(
        """
        import sys, warnings
        sys.modules["zarr_fused._scatter"] = None  # as if it had never been built
        import zarr, numpy as np
        # the default pipeline is unaffected by a broken entry point
        b = zarr.create_array({}, shape=(6,), chunks=(4,), dtype="i2")
        b[:] = 1
        with zarr.config.set({"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"}):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                a = zarr.create_array({}, shape=(6,), chunks=(4,), dtype=">i2", compressors=None)
                a[:] = np.arange(6)
                ok = bool((a[:] == np.arange(6)).all() and (a[1:5:2] == [1, 3]).all())
            names = {type(w.message).__name__ for w in caught}
            print("values", ok)
            print("warned", "ZarrFusedWarning" in names, sum(
                "compiled extensions" in str(w.message) for w in caught))
            import zarr_fused
            print("native", zarr_fused.native_info())
            with zarr.config.set({"codec_pipeline.strict": True}):
                try:
                    a[:]
                except Exception as exc:
                    print("strict", type(exc).__name__)
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "values True" in lines
    assert "warned True 1" in lines
    assert "'codecs': []" in out.stdout and "False" in out.stdout
    assert "strict NativeExtensionError" in lines


_EXTENSIONS = (
    "_scatter",
    "_localio",
    "_fileio",
    "_codecs",
    "_codec_batch",
    "_shard_index",
    "_shard",
    "_shard_local",
    "_filters",
    "_cast_value",
    "_region_plan",
)


@pytest.mark.parametrize(
    "missing",
    [pytest.param(",".join(_EXTENSIONS), id="all")]
    + [pytest.param(name, id=name) for name in _EXTENSIONS],
)
def test_missing_extensions_fall_back_on_every_path(tmp_path: Path, missing: str) -> None:
    """Without some or all compiled modules (never built, a partial build,
    built for another interpreter), zarr_fused imports and every path
    (unsharded and sharded, LocalStore and MemoryStore) takes zarr's code."""
    out = _run(
        f"""
        import sys, warnings
        for name in {missing!r}.split(","):
            sys.modules["zarr_fused." + name] = None  # as if it had never been built
        import numpy as np, zarr
        from zarr.storage import LocalStore, MemoryStore
        warnings.simplefilter("ignore")  # the one "compiled extensions" warning
        expected = np.arange(20, dtype="<i2")
        expected[3:7] = 9
        results = []
        with zarr.config.set({{"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"}}):
            for n, store in enumerate([LocalStore({str(tmp_path)!r}), MemoryStore()]):
                for shards in (None, (8,)):
                    a = zarr.create_array(
                        store, name=f"a{{n}}{{shards}}", shape=(20,), chunks=(4,),
                        shards=shards, dtype="<i2",
                    )
                    a[:] = np.arange(20)
                    a[3:7] = 9
                    results.append(bool((a[:] == expected).all()))
                    results.append(bool((a[1:15:3] == expected[1:15:3]).all()))
        print("values", results)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "values " + str([True] * 8)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("True", "UnsupportedError"),
        ("true", "UnsupportedError"),
        ("1", "UnsupportedError"),
        ("yes", "UnsupportedError"),
        ("ON", "UnsupportedError"),
        ("False", "fallback"),
        ("false", "fallback"),
        ("0", "fallback"),
        ("off", "fallback"),
        ("maybe", "fallback ZarrUserWarning"),
        ("2", "fallback ZarrUserWarning"),
    ],
)
def test_strict_mode_environment_spellings(value: str, expected: str) -> None:
    """What each spelling of ``ZARR_CODEC_PIPELINE__STRICT`` does, as the
    README and `zarr_fused.config` document it."""
    script = textwrap.dedent(
        """
        import warnings
        import zarr
        from zarr.codecs.numcodecs import BZ2
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            a = zarr.create_array({}, shape=(4,), chunks=(2,), dtype="f8",
                                  compressors=BZ2(level=1))
            try:
                a[:] = 1.0
                outcome = "fallback"
            except Exception as exc:
                outcome = type(exc).__name__
        names = {w.category.__name__ for w in caught if "strict" in str(w.message)}
        print(" ".join([outcome, *sorted(names)]))
        """
    )
    env = {
        "ZARR_CODEC_PIPELINE__PATH": FUSED,
        "ZARR_CODEC_PIPELINE__STRICT": value,
        "PATH": "/usr/bin:/bin",
    }
    out = run_in_python("-c", script, env=env, check=True)
    assert out.stdout.strip() == expected


def test_docs_state_the_accepted_strict_spellings() -> None:
    """README, the config module and the configuration page say the same."""
    import zarr_fused.config

    root = Path(__file__).resolve().parents[1]
    readme_row = next(
        line
        for line in (root / "README.md").read_text().splitlines()
        if line.startswith("| `codec_pipeline.strict`")
    )
    for text in (
        readme_row,
        zarr_fused.config.__doc__ or "",
        (root / "docs" / "configuration.md").read_text(),
    ):
        for spelling in ("true", "yes", "on", "false", "no", "off"):
            assert f"`{spelling}`" in text or f"``{spelling}``" in text, (spelling, text[:80])


def test_sharded_array_with_an_unregistered_inner_codec(fused: None) -> None:
    """A codec object need not be registered by name (zarr's pipelines
    accept it): the plan keeps the objects it was given."""
    from dataclasses import dataclass

    from zarr.abc.codec import BytesBytesCodec

    @dataclass(frozen=True)
    class Noop(BytesBytesCodec):
        is_fixed_size = True

        def to_dict(self) -> dict[str, Any]:
            return {"name": "zarr-fused-test-unregistered-noop"}

        async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            return chunk_bytes

        async def _encode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            return chunk_bytes

        def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
            return input_byte_length

    arr = zarr.create_array(
        {}, shape=(16,), chunks=(4,), shards=(8,), dtype="int32", compressors=[Noop()]
    )
    arr[...] = np.arange(16, dtype="int32")
    assert_same_values(arr[...], np.arange(16, dtype="int32"))
