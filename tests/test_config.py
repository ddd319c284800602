"""Configuration keys: `zarr_fused.config` (strict mode, the shard write lock)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import zarr
from zarr.errors import ZarrUserWarning

from zarr_fused.config import SHARD_WRITE_LOCK_KEY, STRICT_KEY, shard_write_lock, strict_mode

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
