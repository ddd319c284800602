"""Configuration keys: `zarr_fused.config` (strict mode, the shard write lock,
the count settings' one parser)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import zarr
from zarr.errors import ZarrUserWarning

from zarr_fused._cpus import default_max_workers, resolve_max_workers
from zarr_fused.config import (
    ASYNC_CONCURRENCY_KEY,
    IO_CONCURRENCY_KEY,
    MAX_WORKERS_CAP,
    MAX_WORKERS_KEY,
    SHARD_WRITE_LOCK_KEY,
    STRICT_KEY,
    int_setting,
    shard_write_lock,
    strict_mode,
)
from zarr_fused.io.engine import DEFAULT_IO_CONCURRENCY, IO_CONCURRENCY_CAP, resolve_io_concurrency
from zarr_fused.io.requests import ASYNC_CONCURRENCY_CAP, request_limit

if TYPE_CHECKING:
    from collections.abc import Callable

# -- strict_mode -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(True, True, id="True"),
        pytest.param(False, False, id="False"),
        pytest.param("true", True, id="str-true"),
        pytest.param("false", False, id="str-false"),
        pytest.param("TRUE", True, id="str-TRUE"),
        pytest.param(" yes ", True, id="str-yes"),
        pytest.param("off", False, id="str-off"),
        pytest.param("1", True, id="str-1"),
        pytest.param("0", False, id="str-0"),
        pytest.param("", False, id="str-empty"),
        pytest.param(1, True, id="1"),
        pytest.param(0, False, id="0"),
    ],
)
def test_strict_mode_valid(value: Any, expected: bool) -> None:
    with zarr.config.set({STRICT_KEY: value}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert strict_mode() is expected


def test_strict_mode_default_is_off() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert strict_mode() is False


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("maybe", id="str-maybe"),
        pytest.param("strict", id="str-strict"),
        pytest.param(2, id="2"),
        pytest.param(-1, id="-1"),
        pytest.param(1.5, id="1.5"),
        pytest.param([], id="list"),
    ],
)
def test_strict_mode_invalid_warns_and_is_off(value: Any) -> None:
    with zarr.config.set({STRICT_KEY: value}), pytest.warns(ZarrUserWarning, match="strict"):
        assert strict_mode() is False


# -- shard_write_lock ------------------------------------------------------------


def test_shard_write_lock_default_is_on() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shard_write_lock() is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(False, False, id="False"),
        pytest.param("off", False, id="str-off"),
        pytest.param("0", False, id="str-0"),
        pytest.param(True, True, id="True"),
        pytest.param("yes", True, id="str-yes"),
    ],
)
def test_shard_write_lock_valid(value: Any, expected: bool) -> None:
    with zarr.config.set({SHARD_WRITE_LOCK_KEY: value}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shard_write_lock() is expected


@pytest.mark.parametrize("value", [pytest.param("maybe", id="str-maybe"), pytest.param(2, id="2")])
def test_shard_write_lock_invalid_warns_and_stays_on(value: Any) -> None:
    with (
        zarr.config.set({SHARD_WRITE_LOCK_KEY: value}),
        pytest.warns(ZarrUserWarning, match="shard_write_lock"),
    ):
        assert shard_write_lock() is True


# -- int_setting: max_workers, io_concurrency, async_concurrency ----------------


def _max_workers_default() -> str:
    return str(default_max_workers()[0])


# name -> (key, the resolver, its cap, what an invalid value gives in words)
COUNTS: dict[str, tuple[str, Callable[[], int | None], int, Callable[[], str]]] = {
    "max_workers": (MAX_WORKERS_KEY, resolve_max_workers, MAX_WORKERS_CAP, _max_workers_default),
    "io_concurrency": (
        IO_CONCURRENCY_KEY,
        resolve_io_concurrency,
        IO_CONCURRENCY_CAP,
        lambda: str(DEFAULT_IO_CONCURRENCY),
    ),
    "async_concurrency": (
        ASYNC_CONCURRENCY_KEY,
        request_limit,
        ASYNC_CONCURRENCY_CAP,
        lambda: "the default rule",
    ),
}
COUNT_NAMES = [pytest.param(name, id=name) for name in COUNTS]


@pytest.mark.parametrize("name", COUNT_NAMES)
def test_count_settings_name_what_an_invalid_value_gives(name: str) -> None:
    key, resolve, _, using = COUNTS[name]
    expected = (
        f"Ignoring invalid `{key}` config value 'many' (expected an integer >= 1 or None); "
        f"using {using()}."
    )
    with zarr.config.set({key: "many"}), pytest.warns(ZarrUserWarning) as record:
        resolve()
    assert [str(w.message) for w in record] == [expected]


@pytest.mark.parametrize("name", COUNT_NAMES)
def test_count_settings_clamp_to_their_cap(name: str) -> None:
    key, resolve, cap, _ = COUNTS[name]
    expected = f"`{key}` = {cap + 1} is above the cap of {cap}; using {cap}."
    with zarr.config.set({key: str(cap + 1)}), pytest.warns(ZarrUserWarning) as record:
        assert resolve() == cap
    assert [str(w.message) for w in record] == [expected]


@pytest.mark.parametrize("name", COUNT_NAMES)
@pytest.mark.parametrize("value", [pytest.param("0", id="invalid"), pytest.param(10_000, id="cap")])
def test_count_settings_warn_at_the_resolvers_caller(name: str, value: Any) -> None:
    # the warning names the line that asked for the setting, not config.py
    key, resolve, _, _ = COUNTS[name]
    with zarr.config.set({key: value}), pytest.warns(ZarrUserWarning) as record:
        resolve()
    assert [w.filename for w in record] == [__file__]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(5, 5, id="int"),
        pytest.param(np.int32(6), 6, id="numpy-int"),
        pytest.param(" +7\n", 7, id="env-string"),
    ],
)
def test_int_setting_valid_values_leave_the_default_alone(value: Any, expected: int) -> None:
    asked: list[bool] = []

    def default() -> int:
        asked.append(True)
        return 1

    with zarr.config.set({IO_CONCURRENCY_KEY: value}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int_setting(IO_CONCURRENCY_KEY, cap=10, default=default) == expected
    assert asked == []


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(True, id="bool"),
        pytest.param(3.0, id="float"),
        pytest.param("3.0", id="str-float"),
        pytest.param(-2, id="negative"),
        pytest.param([3], id="list"),
    ],
)
def test_int_setting_invalid_values_give_the_default(value: Any) -> None:
    with (
        zarr.config.set({IO_CONCURRENCY_KEY: value}),
        pytest.warns(ZarrUserWarning, match="using 9"),
    ):
        assert int_setting(IO_CONCURRENCY_KEY, cap=10, default=lambda: 9) == 9


def test_int_setting_unset_gives_the_default_silently() -> None:
    with zarr.config.set({IO_CONCURRENCY_KEY: None}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int_setting(IO_CONCURRENCY_KEY, cap=10, default=lambda: None) is None
