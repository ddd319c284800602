"""zarr's ``cast_value`` chain read and written by zarr's Batched pipeline and
by zarr_fused, side by side in one process.

float32 values (a NaN every 97th) stored as int16 by ``cast_value`` (NaN ->
-32768 on encode, back on decode, clamp), zstd level 1, on a LocalStore:
unsharded (256^2 chunks) and sharded (1024^2 shards of 256^2 inner chunks).
Interleaved rounds (the order alternating) of a whole-array read and a
whole-array write; prints the medians of wall time and of process CPU time
(all threads) and the ratio Batched / zarr_fused of each:

    .venv/bin/python asv_bench/cast_value_ratios.py /tmp/cast-data 9 --pin both

(``--pin``: see ``_side_by_side_cli``.) With ``--chain f4-i4``: int32 values
stored as float32 by ``cast_value`` (rounding nearest-even, no
``out_of_range``), whose decoding can fail on a stored value (NaN, out of
range), so that a shard's inner chunk may be refused:

    .venv/bin/python asv_bench/cast_value_ratios.py /tmp/cast-data 9 --chain f4-i4
"""

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.codecs.cast_value import CastValue

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _side_by_side_cli

PIPELINES = {
    "batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "fused": "zarr_fused.FusedCodecPipeline",
}
SHAPE, CHUNK, SHARD = (2048, 2048), (256, 256), (1024, 1024)


#: the value type of each chain: "f4-i2" (float32 values stored as int16),
#: "f4-i4" (int32 values stored as float32)
DTYPES = {"f4-i2": "float32", "f4-i4": "int32"}


def codec(chain: str) -> CastValue:
    if chain == "f4-i4":
        return CastValue(data_type="float32")
    return CastValue(
        data_type="int16",
        out_of_range="clamp",
        scalar_map={"encode": [("NaN", -32768)], "decode": [(-32768, "NaN")]},
    )


def create(path: str, sharded: bool, chain: str) -> zarr.Array:
    filters = [codec(chain)]
    if sharded:
        inner = ShardingCodec(
            chunk_shape=CHUNK, codecs=[*filters, BytesCodec(), ZstdCodec(level=1)]
        )
        kw = {"chunks": SHARD, "serializer": inner, "filters": None, "compressors": None}
    else:
        kw = {"chunks": CHUNK, "filters": filters, "compressors": [ZstdCodec(level=1)]}
    fill = 0 if chain == "f4-i4" else np.nan
    return zarr.create_array(
        path, shape=SHAPE, dtype=DTYPES[chain], fill_value=fill, overwrite=True, **kw
    )


def timed(run, *args) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    run(*args)
    return time.perf_counter() - w0, time.process_time() - c0


def measure(root: str, rounds: int, chain: str) -> None:
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(SHAPE) * 3000).astype("float32")
    data.flat[::97] = np.nan
    if chain == "f4-i4":  # integers float32 holds exactly
        data = np.nan_to_num(data).astype(DTYPES[chain])
    expected = None
    res: dict = {}
    for layout in ("unsharded", "sharded"):
        for who, path in PIPELINES.items():
            with zarr.config.set(
                {"codec_pipeline.path": path, "codec_pipeline.strict": who == "fused"}
            ):
                create(f"{root}/{layout}-{who}", layout == "sharded", chain)[:] = data
        for who, path in PIPELINES.items():
            with zarr.config.set({"codec_pipeline.path": path}):
                got = zarr.open_array(f"{root}/{layout}-{who}", mode="r")[:]
            expected = got if expected is None else expected
            assert np.array_equal(got, expected, equal_nan=True), who
    for r in range(rounds):
        for layout in ("unsharded", "sharded"):
            order = list(PIPELINES) if r % 2 == 0 else list(PIPELINES)[::-1]
            for who in order:
                config = {"codec_pipeline.path": PIPELINES[who]}
                with zarr.config.set(config):
                    array = zarr.open_array(f"{root}/{layout}-{who}", mode="r+")
                    res.setdefault((layout, "read", who), []).append(timed(array.__getitem__, ...))
                    res.setdefault((layout, "write", who), []).append(
                        timed(array.__setitem__, ..., data)
                    )
    report(res)


def report(res: dict) -> None:
    for layout in ("unsharded", "sharded"):
        for op in ("read", "write"):
            b = res[layout, op, "batched"]
            f = res[layout, op, "fused"]
            bw, bc = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
            fw, fc = statistics.median(x[0] for x in f), statistics.median(x[1] for x in f)
            print(
                f"{layout:9} {op:5} wall batched {bw * 1e3:7.1f} ms fused {fw * 1e3:7.1f} ms "
                f"ratio {bw / fw:5.2f} | cpu batched {bc * 1e3:7.1f} ms fused {fc * 1e3:7.1f} ms "
                f"ratio {bc / fc:5.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    options = _side_by_side_cli.parser(__doc__, repeat=None)
    options.add_argument("root", help="the folder the arrays are written to")
    options.add_argument("repeat", type=int, nargs="?", default=9, metavar="rounds")
    options.add_argument("--chain", choices=list(DTYPES), default="f4-i2")
    args, _ = options.parse_known_args(argv)
    title = f"{SHAPE} {DTYPES[args.chain]} cast_value {args.chain}, zstd 1"
    return _side_by_side_cli.main(
        __file__, options, argv, title, lambda args: measure(args.root, args.repeat, args.chain)
    )


if __name__ == "__main__":
    sys.exit(main())
