"""The streamed pickle reader (``iter_pickle_items``): the same items as ``pickle.load``, in order, without the
list held; whatever it does not read goes to the restricted loader, with its refusals."""

from __future__ import annotations

import os
import pickle
import random
import tracemalloc

import numpy as np
import pytest

from avion_ds.data import safe_pickle
from avion_ds.data.safe_pickle import NotASequence, UnreadablePickle, UnsafePickle, iter_pickle_items


def _value(rng: random.Random, protocol: int, depth: int = 0):
    """A random plain-data value: every container and scalar kind the stream reads, nested (sets from
    protocol 4, bytes from protocol 3: earlier protocols write them through a global)."""
    r = rng.random()
    if protocol < 4:
        r = min(r, 0.79)
    if depth > 2 or r < 0.35:
        value = rng.choice(
            [rng.randint(-(2**40), 2**40), rng.randint(0, 300), rng.randint(256, 65535), -5, 2**70, -(2**70),
             rng.random(), float("inf"), None, True, False, "", "é\U0001f600" * rng.randint(1, 3), "\udc80",
             "x" * rng.randint(250, 300), b"", b"\x00ab", b"y" * 300]
        )  # fmt: skip
        return value.decode() if isinstance(value, bytes) and protocol < 3 else value
    if r < 0.5:
        return tuple(_value(rng, protocol, depth + 1) for _ in range(rng.randint(0, 5)))
    if r < 0.7:
        return [_value(rng, protocol, depth + 1) for _ in range(rng.randint(0, 5))]
    if r < 0.8:
        return {
            rng.choice(["a", "b", 1, 2.5, (1, "t")]): _value(rng, protocol, depth + 1) for _ in range(rng.randint(0, 3))
        }
    if r < 0.9:
        return {rng.randint(0, 9) for _ in range(rng.randint(0, 3))}
    return frozenset({rng.randint(0, 9), "f"})


def _avion_rows(rng: random.Random, n: int) -> list:
    """AVION's narration rows: a video's uid string is one object for all its rows (the pickler writes it
    once), a video's rows spread over several of the pickler's 1000-row batches, some videos seen once."""
    uids = [f"{rng.getrandbits(64):016x}" for _ in range(7)]
    out = []
    for i in range(n):
        uid = rng.choice(uids) if rng.random() < 0.9 else f"lonely-{i}"
        text = f"#C C does thing {i}" if rng.random() < 0.9 else (f"#C C a {i}", f"#C C b {i}")
        out.append((uid, i * 0.5, i * 0.5 + rng.choice([1.0, float("nan")]), text))
    return out


@pytest.fixture
def fallbacks(monkeypatch) -> list:
    """Every hand-over to the restricted loader, recorded."""
    calls: list = []
    real = safe_pickle.load_pickle
    monkeypatch.setattr(safe_pickle, "load_pickle", lambda path: calls.append(path) or real(path))
    return calls


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 2, 999, 1000, 1001, 2600])
def test_avion_rows_are_streamed(tmp_path, fallbacks, protocol, n) -> None:
    rows = _avion_rows(random.Random(n * 10 + protocol), n)
    path = tmp_path / "rows.pkl"
    path.write_bytes(pickle.dumps(rows, protocol=protocol))
    got = list(iter_pickle_items(path, shared=(0,)))
    assert repr(got) == repr(pickle.loads(path.read_bytes()))
    assert fallbacks == []  # read by the stream itself: the uids kept in its memo, nothing read back dropped


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", range(6))
def test_any_plain_data_list_gives_pickle_loads_items(tmp_path, protocol, seed) -> None:
    rng = random.Random(seed * 10 + protocol)
    rows = [_value(rng, protocol) for _ in range(rng.choice([1, 5, 1500, 3100]))]
    path = tmp_path / "any.pkl"
    path.write_bytes(pickle.dumps(rows, protocol=protocol))
    for shared in ((), (0,), (-1, 2)):
        assert repr(list(iter_pickle_items(path, shared=shared))) == repr(pickle.loads(path.read_bytes()))


def test_text_longer_than_a_read_block_and_across_block_edges(tmp_path, fallbacks, monkeypatch) -> None:
    monkeypatch.setattr(safe_pickle, "_BLOCK", 64)  # every payload crosses reads
    rng = random.Random(3)
    rows = [("u", 1.0, 2.0, "t" * rng.randint(0, 600), b"b" * rng.randint(0, 300)) for _ in range(300)]
    rows.append(("u", 0.0, 1.0, "z" * (1 << 17)))  # BINUNICODE, longer than any buffer
    path = tmp_path / "long.pkl"
    for protocol in (3, 4, 5):  # protocol 2 writes bytes through a global
        path.write_bytes(pickle.dumps(rows, protocol=protocol))
        assert list(iter_pickle_items(path, shared=(0,))) == rows
    assert fallbacks == []


@pytest.mark.parametrize(
    "case",
    ["later_ref_to_item", "shared_late", "numpy_scalar", "protocol_0", "top_tuple", "recursive"],
)
def test_what_the_stream_does_not_read_is_handed_over_with_the_same_items(tmp_path, fallbacks, case) -> None:
    rows = _avion_rows(random.Random(5), 2500)
    protocol, shared = 4, (0,)
    if case == "later_ref_to_item":
        rows.append(rows[3])  # the pickler writes a reference to the memo entry the stream dropped
    elif case == "shared_late":
        late = "read back two batches later"
        rows[5], rows[2400] = ("v", 0.0, 1.0, late), ("v", 0.0, 1.0, late)  # one object: one memo entry
    elif case == "numpy_scalar":
        rows.insert(1500, ("v", np.float64(1.5), np.float32(2.0), "n"))
    elif case == "protocol_0":
        protocol = 0
    elif case == "top_tuple":
        rows = tuple(rows)
    else:
        rows.append(rows)
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps(rows, protocol=protocol))
    got = list(iter_pickle_items(path, shared=shared))
    if case == "recursive":
        assert repr(got[:-1]) == repr(rows[:-1]) and repr(got[-1][0]) == repr(rows[0]) and len(got[-1]) == len(rows)
    else:
        assert repr(got) == repr(list(rows))
    assert fallbacks == [path]


def test_the_list_is_never_held(tmp_path, fallbacks) -> None:
    rows = _avion_rows(random.Random(7), 60_000)
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps(rows, protocol=4))
    del rows
    tracemalloc.start()
    try:
        whole = pickle.loads(path.read_bytes())
        listed = tracemalloc.get_traced_memory()[1]
        del whole
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert sum(1 for _ in iter_pickle_items(path, shared=(0,))) == 60_000
        streamed = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert streamed * 3 < listed, (streamed, listed)  # one read buffer and the uids, not the list
    assert fallbacks == []


def test_handed_over_items_are_dropped_by_the_loader_too(tmp_path, monkeypatch) -> None:
    data = [(f"v{k}", 0.0, 1.0) for k in range(5)]
    monkeypatch.setattr(safe_pickle, "load_pickle", lambda path: data)
    path = tmp_path / "p0.pkl"
    path.write_bytes(pickle.dumps(data, protocol=0))  # not streamed: the loader's list
    items = iter_pickle_items(path)
    assert next(items) == ("v0", 0.0, 1.0) and data[0] is None and data[1] is not None
    assert [x[0] for x in items] == ["v1", "v2", "v3", "v4"] and data == [None] * 5


class _Code:
    def __reduce__(self):
        return os.system, ("true",)


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        ([("v", 0.0, 1.0, "a")] * 1500 + [_Code()], UnsafePickle, r"x.pkl: refused to unpickle global posix.system"),
        ({"v": 1}, NotASequence, r"x.pkl: the pickled object is a dict, not a list"),
        ("truncated", UnreadablePickle, r"x.pkl: not a readable pickle \(truncated"),
    ],
)
def test_refusals_and_bad_files_are_the_loaders(tmp_path, content, error, message) -> None:
    path = tmp_path / "x.pkl"
    if content == "truncated":
        path.write_bytes(pickle.dumps([("v", 0.0, 1.0, "a" * k) for k in range(3000)], protocol=4)[:-2000])
    else:
        path.write_bytes(pickle.dumps(content, protocol=4))
    with pytest.raises(error, match=message):
        list(iter_pickle_items(path))
    with pytest.raises(FileNotFoundError, match="absent.pkl"):
        list(iter_pickle_items(tmp_path / "absent.pkl"))


def test_shared_positions_keep_what_the_next_batch_reads_back(tmp_path, fallbacks) -> None:
    late = "P01_01"  # first written as the last row of the pickler's first 1000-row batch, read back after it
    rows = [(f"v{i}", 0.0, 1.0, f"n {i}") for i in range(999)] + [(late, 0.0, 1.0, "a"), (late, 1.0, 2.0, "b")]
    path = tmp_path / "late.pkl"
    path.write_bytes(pickle.dumps(rows, protocol=4))
    assert list(iter_pickle_items(path, shared=(0,))) == rows and fallbacks == []
    assert list(iter_pickle_items(path)) == rows and fallbacks == [path]  # dropped unnamed: the loader reads it
