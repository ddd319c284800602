"""Run one fuzz target, or replay the corpus.

    python tests/fuzz/run.py --target shard-partial --seconds 60 --seed 1
    python tests/fuzz/run.py --target all --seconds 20 --seed 1   # each in turn
    python tests/fuzz/run.py --replay                             # corpus only

The engine is atheris (libFuzzer) when it imports. Its coverage feedback
comes from zarr_fused's Python modules (instrumented at import) and, when
the extensions were built by ``tests/fuzz/build.sh fuzz`` (clang,
``-fsanitize=address,undefined,fuzzer-no-link``) and atheris'
``asan_with_fuzzer.so`` is preloaded, from the compiled kernels too;
``make fuzz`` sets all of this up. Without atheris a seeded mutation loop
runs instead (byte flips, insertions, deletions, splices of corpus files,
no coverage feedback) so the targets still run anywhere.

New inputs that libFuzzer finds go to ``build/fuzz-corpus/<target>`` (the
checked-in seeds under ``tests/fuzz/corpus`` are read, never written); a
failing input is written to ``build/fuzz-crashes/`` and reproduced with
``--replay --input FILE``. Each run ends with one summary line:
``fuzz: <target> engine=... execs=N seconds=S outcomes={...}``.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

CORPUS = HERE / "corpus"
WORK = ROOT / "build" / "fuzz-corpus"
CRASHES = ROOT / "build" / "fuzz-crashes"
#: a single input that runs longer than this is a hang
TIMEOUT = 20


def _corpus_files(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).glob("*") if p.is_file())


def replay(names: list[str], inputs: list[Path]) -> int:
    import targets

    targets.configure()
    failures = 0
    for name in names:
        files = inputs or _corpus_files(name)
        outcomes: collections.Counter[str] = collections.Counter()
        for path in files:
            try:
                outcomes[targets.TARGETS[name](path.read_bytes())] += 1
            except targets.Violation as exc:
                failures += 1
                print(f"fuzz: {name} {path}: VIOLATION {exc}")
        print(f"fuzz: {name} replayed={len(files)} outcomes={dict(outcomes)}")
    return 1 if failures else 0


def _mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 3 and buf:
            del buf[pos : pos + rng.randrange(1, 17)]
        elif op == 4 and len(buf) >= 8:
            at = rng.randrange(len(buf) - 7)
            value = rng.choice((0, 2**64 - 1, 2**63, 2**40, rng.randrange(2**16), len(buf)))
            buf[at : at + 8] = value.to_bytes(8, rng.choice(("little", "big")))
        else:
            other = rng.choice(pool)
            cut = rng.randrange(len(other) + 1)
            buf[pos:] = other[cut:]
    return bytes(buf)


def mutation_loop(name: str, seconds: float, seed: int) -> int:
    """The engine without atheris: seeded mutations of the corpus."""
    import targets

    targets.configure()
    target = targets.TARGETS[name]
    pool = [p.read_bytes() for p in _corpus_files(name)] or [b""]
    rng = random.Random(seed)
    outcomes: collections.Counter[str] = collections.Counter()

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"one input ran longer than {TIMEOUT} s")

    signal.signal(signal.SIGALRM, on_alarm)
    execs, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        data = _mutate(rng, rng.choice(pool), pool)
        signal.alarm(TIMEOUT)
        try:
            outcomes[target(data)] += 1
        except (targets.Violation, TimeoutError) as exc:
            CRASHES.mkdir(parents=True, exist_ok=True)
            path = CRASHES / f"{name}-seed{seed}-{execs}"
            path.write_bytes(data)
            print(f"fuzz: {name}: {type(exc).__name__}: {exc}\nfuzz: input saved to {path}")
            return 1
        finally:
            signal.alarm(0)
        execs += 1
    print(
        f"fuzz: {name} engine=mutation execs={execs} seconds={time.monotonic() - start:.0f} "
        f"outcomes={dict(outcomes)}"
    )
    return 0


def atheris_run(name: str, seconds: float, seed: int, extra: list[str]) -> int:
    import atheris

    # Nothing of zarr_fused or the targets may be imported before this block:
    # atheris instruments modules as they are first imported.
    with atheris.instrument_imports(include=["zarr_fused", "targets"]):
        import targets

        import zarr_fused.pipeline
        import zarr_fused.shard.read  # noqa: F401  (the sharded read path)
    if name not in targets.TARGETS:
        sys.exit(f"unknown target {name!r}; targets: {sorted(targets.TARGETS)}")
    targets.configure()
    target = targets.TARGETS[name]
    outcomes: collections.Counter[str] = collections.Counter()
    native = "native+python" if os.environ.get("ZARR_FUSED_FUZZ_BUILD") else "python"
    start = time.monotonic()
    reported = False

    def one_input(data: bytes) -> None:
        nonlocal reported
        outcomes[target(data)] += 1
        # libFuzzer ends the process at -max_total_time, past Python's atexit:
        # the summary goes out just before
        if not reported and time.monotonic() - start >= seconds - 1:
            reported = True
            print(
                f"fuzz: {name} engine=atheris coverage={native} "
                f"execs={sum(outcomes.values())} seconds={time.monotonic() - start:.0f} "
                f"outcomes={dict(outcomes)}",
                flush=True,
            )

    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    CRASHES.mkdir(parents=True, exist_ok=True)
    args = [
        sys.argv[0],
        f"-seed={seed}",
        f"-max_total_time={int(seconds)}",
        f"-timeout={TIMEOUT}",
        "-rss_limit_mb=4096",
        f"-artifact_prefix={CRASHES}/{name}-",
        "-print_final_stats=1",
        *extra,
        str(work),
        str(CORPUS / name),
    ]
    atheris.Setup(args, one_input)
    atheris.Fuzz()
    return 0


def _target_names() -> list[str]:
    """Names of the targets, read in a child process: the atheris engine
    must be the first to import the targets and zarr_fused."""
    import subprocess

    code = "import sys; sys.path.insert(0, sys.argv[1]); import targets; print(*targets.TARGETS)"
    return subprocess.check_output([sys.executable, "-P", "-c", code, str(HERE)], text=True).split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="all", help="all, or one target (--list)")
    parser.add_argument("--list", action="store_true", help="print the targets")
    parser.add_argument("--seconds", type=float, default=60, help="per target")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", choices=["auto", "atheris", "mutation"], default="auto")
    parser.add_argument("--replay", action="store_true", help="run the corpus (or --input) once")
    parser.add_argument("--input", type=Path, action="append", default=[])
    parser.add_argument("libfuzzer_args", nargs="*", help="passed to libFuzzer (after --)")
    args = parser.parse_args()
    if args.list or args.target == "all":
        names = _target_names()
        if args.list:
            print("\n".join(names))
            return 0
    else:
        names = [args.target]
    if args.replay:
        return replay(names, args.input)
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "mutation"
    if len(names) > 1:
        # libFuzzer owns its process (it exits when done): one child per target
        import subprocess

        rc = 0
        for name in names:
            cmd = [
                sys.executable,
                "-P",
                __file__,
                "--target",
                name,
                "--seconds",
                str(args.seconds),
                "--seed",
                str(args.seed),
                "--engine",
                engine,
            ]
            if args.libfuzzer_args:
                cmd += ["--", *args.libfuzzer_args]
            rc |= subprocess.call(cmd)
        return rc
    if engine == "atheris":
        return atheris_run(names[0], args.seconds, args.seed, args.libfuzzer_args)
    return mutation_loop(names[0], args.seconds, args.seed)


if __name__ == "__main__":
    sys.exit(main())
