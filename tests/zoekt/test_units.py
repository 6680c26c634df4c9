"""Binary byte counts are labelled with binary units."""

from __future__ import annotations

import pytest

from zoekt.units import binary_size, binary_size_in, binary_unit

NB = "\u00a0"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(0, f"0{NB}bytes", id="zero"),
        pytest.param(1, f"1{NB}byte", id="one byte"),
        pytest.param(1023, f"1023{NB}bytes", id="under a KiB"),
        pytest.param(1024, f"1.0{NB}KiB", id="a KiB"),
        pytest.param(1536 * 1024**2, f"1.5{NB}GiB", id="1.5 GiB"),
        pytest.param(16 * 1024**3, f"16.0{NB}GiB", id="16 GiB"),
        pytest.param(3 * 1024**4, f"3.0{NB}TiB", id="3 TiB"),
        pytest.param(-2 * 1024**2, f"-2.0{NB}MiB", id="negative"),
    ],
)
def test_binary_sizes_carry_binary_unit_names(value, text):
    assert binary_size(value) == text


@pytest.mark.parametrize(
    ("value", "unit"),
    [
        (0, "bytes"),
        (1, "bytes"),
        (1023, "bytes"),
        (1024, "KiB"),
        (805 * 1024**2, "MiB"),
        (1024**3, "GiB"),
    ],
)
def test_binary_unit_is_the_unit_binary_size_writes(value, unit):
    assert binary_unit(value) == unit


def test_sizes_on_one_row_share_the_unit_of_the_largest():
    unit = binary_unit(max(1024**3, 805 * 1024**2 + 300 * 1024))
    assert [binary_size_in(v, unit) for v in (1024**3, 805 * 1024**2 + 300 * 1024)] == [
        "1.0\u00a0GiB",
        "0.8\u00a0GiB",
    ]
