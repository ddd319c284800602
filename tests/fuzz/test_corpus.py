"""Replay the fuzz corpus: every seed, and every input a fuzz run once
failed on, keeps meeting the invariant of `targets` (same values as zarr,
or a typed error naming the key; no untyped error, no oversized allocation).

Fast (a few milliseconds per file) and part of the normal suite; the
fuzzing itself is ``make fuzz`` (docs/fuzzing.md).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import targets
import zarr
from zarr.core.buffer import cpu
from zarr.storage import MemoryStore

from zarr_fused.errors import CorruptChunkError

CORPUS = Path(__file__).resolve().parent / "corpus"

#: corpus files that reproduce a bug not fixed yet: name -> reason
# corpus files that fail the invariant today, with why (none)
KNOWN_BUGS: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _configured() -> Iterator[None]:
    # scoped to each test: the rest of the suite runs with its own settings
    with zarr.config.set(targets.SETTINGS):
        yield


def _cases() -> list[object]:
    cases = []
    for path in sorted(CORPUS.glob("*/*")):
        name = f"{path.parent.name}/{path.name}"
        marks = (
            [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name])] if name in KNOWN_BUGS else []
        )
        cases.append(pytest.param(path, id=name, marks=marks))
    return cases


@pytest.mark.parametrize("path", _cases())
def test_corpus_meets_the_invariant(path: Path) -> None:
    outcome = targets.TARGETS[path.parent.name](path.read_bytes())
    assert outcome in {"same", "accepted", "rejected", "short"}


def test_every_target_has_seeds() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(targets.TARGETS)


@pytest.mark.parametrize("name", sorted(n for n in targets.TARGETS if n != "index"))
def test_valid_seeds_read_the_same(name: str) -> None:
    """The harness compares values: a valid seed reads the same both ways
    (so the fuzz runs start from inputs that reach the decoders)."""
    seeds = [
        p for p in (CORPUS / name).iterdir() if p.name == "valid" or p.name.startswith("inner")
    ]
    assert seeds
    assert {targets.TARGETS[name](p.read_bytes()) for p in seeds} == {"same"}


def test_tampered_blosc_flags_are_refused() -> None:
    """A stored blosc chunk whose flags byte was tampered with (0x33 ->
    0x45) raises CorruptChunkError naming the key, whichever c-blosc is
    linked (one built with snappy decodes it into other values)."""
    from seeds import tampered_blosc_chunk

    data = (CORPUS / "chunk-blosc" / "stored-flags-tampered").read_bytes()
    assert data == tampered_blosc_chunk()
    store = MemoryStore()
    with zarr.config.set({"codec_pipeline.path": targets.FUSED}):
        array = targets._chunk_array("blosc")(store)
    store._store_dict["c/0/0"] = cpu.Buffer.from_bytes(data[1:])
    with pytest.raises(CorruptChunkError, match="c/0/0"):
        array[...]


def test_harness_flags_wrong_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: a zarr_fused read that returns other values
    than zarr's is a violation."""
    real = targets._read

    def off_by_one(array: zarr.Array, selection: object) -> object:
        value = real(array, selection)
        return value + 1 if array is pair.fused_array else value

    pair = targets._pair(("chunk", "zstd"), targets._chunk_array("zstd"), "c/0/0")
    monkeypatch.setattr(targets, "_read", off_by_one)
    with pytest.raises(targets.Violation, match="zarr_fused read"):
        targets.TARGETS["chunk-zstd"]((CORPUS / "chunk-zstd" / "valid").read_bytes())


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param((0, 16), id="overlaps-first"),
        pytest.param((2**64 - 1, 4), id="half-missing"),
        pytest.param((2**63, 2**63), id="overflow"),
    ],
)
def test_reference_index_rejects(entry: tuple[int, int]) -> None:
    """The index oracle is independent of parse_index and rejects what the
    specification does."""
    pairs = [(0, 16), entry, (2**64 - 1, 2**64 - 1)]
    raw = b"".join(struct.pack("<QQ", *p) for p in pairs)
    got = targets.reference_index(
        raw, 3, checksum=False, big_endian=False, shard_len=-1, index_start=0
    )
    assert isinstance(got, str)
