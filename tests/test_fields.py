"""zoo.fields: the one validator of dataclass fields by annotation."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from zoo.errors import ConfigError
from zoo.fields import check_fields


@dataclasses.dataclass(frozen=True)
class Settings:
    count: int = 1
    rate: float = 0.5
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    limit: int | None = None
    scale: float | str = 1.0
    names: tuple = ()

    def __post_init__(self) -> None:
        check_fields(self)


def test_good_values_pass_and_ints_widen_to_float():
    s = Settings(count=3, rate=2, limit=4, scale="auto", names=("x",))
    assert s.rate == 2.0 and isinstance(s.rate, float) and s.scale == "auto"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("count", True, r"Settings\.count must be int, got bool True"),
        ("count", 1.5, r"Settings\.count must be int, got float 1\.5"),
        ("rate", float("nan"), r"Settings\.rate must be a finite number"),
        ("rate", "fast", r"Settings\.rate must be float, got str"),
        ("flag", 1, r"Settings\.flag must be bool, got int 1"),
        ("mode", "c", r"Settings\.mode = 'c' is not valid; choose one of 'a' \| 'b'"),
        ("limit", "10", r"Settings\.limit must be int, got str '10'"),
        ("scale", None, r"Settings\.scale must be float \| str, got NoneType None"),
        ("names", ["x"], r"Settings\.names must be tuple, got list"),
    ],
)
def test_a_wrong_value_is_an_error_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        Settings(**{field: value})


@dataclasses.dataclass(frozen=True)
class Pair:
    betas: tuple[float, float] = (0.9, 0.99)

    def __post_init__(self) -> None:
        check_fields(self)


def test_a_fixed_tuple_is_checked_item_by_item():
    assert Pair((1, 0.5)).betas == (1.0, 0.5)
    with pytest.raises(ConfigError, match=r"Pair\.betas must be a tuple of 2"):
        Pair((0.9,))
    with pytest.raises(ConfigError, match=r"Pair\.betas\[1\] must be float, got str"):
        Pair((0.9, "x"))
