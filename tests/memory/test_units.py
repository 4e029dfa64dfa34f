import pytest

from avion_ds.memory.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("24GiB", 24 * 2**30),
        ("24 GB", 24 * 10**9),
        ("1.5TiB", int(1.5 * 2**40)),
        ("512MiB", 512 * 2**20),
        ("80gb", 80 * 10**9),
        ("16G", 16 * 2**30),
        ("0B", 0),
        ("100kB", 100_000),
    ],
)
def test_parse_bytes_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("24", "has no unit"),
        ("-3GiB", "negative"),
        ("24 parsecs", "unknown unit"),
        ("lots", "not a memory size"),
        ("", "not a memory size"),
    ],
)
def test_parse_bytes_errors_name_the_value(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_bytes(text, "--gpu-mem")
    msg = str(info.value)
    assert fragment in msg and "--gpu-mem" in msg and repr(text) in msg and "\n" not in msg


def test_format_bytes():
    assert format_bytes(24 * 2**30) == "24.00 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
