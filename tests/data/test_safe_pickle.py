"""The restricted unpickler: plain data (AVION's narration and relevancy pickles) loads, code does not run."""

from __future__ import annotations

import builtins
import collections
import os
import pickle
import subprocess

import numpy as np
import pytest

from avion_ds.data.safe_pickle import UnreadablePickle, UnsafePickle, load_pickle


def _data() -> dict:
    rng = np.random.default_rng(0)
    return {
        "rows": [
            ("000786a7-3f9d", np.float64(1.25), np.float64(2.5), "#C C cuts the onion", np.int64(7)),
            ("000a3525-6c98", 3.0, 4.5, ["c rinses a cup", "c washes the cup"], 1),
        ],
        "relevancy_f64": rng.random((5, 3)),  # AVION's caption relevancy matrix (rows x sentences)
        "relevancy_f32": rng.random((4, 6)).astype(np.float32),
        "transposed": np.asfortranarray(rng.random((3, 4))),
        "scalars": [np.float32(0.5), np.bool_(True), np.str_("x"), np.int32(-3)],
        "names": np.array(["a", "bc"]),
        "objects": np.array([1, "x", (2, 3)], dtype=object),
        "misc": (collections.OrderedDict(a=1), {1, 2}, frozenset({3}), 1 + 2j, b"\x00\xff", True, None),
    }


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_loads_equal(tmp_path, protocol) -> None:
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(_data(), protocol=protocol))
    assert _same(_data(), load_pickle(path))


class _Payload:
    """Unpickling it would create a file (through os.system, subprocess, eval or a custom class)."""

    def __init__(self, how: str, marker: str) -> None:
        self.how, self.marker = how, marker

    def __reduce__(self):
        if self.how == "os.system":
            return os.system, (f"touch {self.marker}",)
        if self.how == "subprocess":
            return subprocess.call, (["touch", self.marker],)
        if self.how == "eval":
            return builtins.eval, (f"open({self.marker!r}, 'w').close()",)
        if self.how == "import":  # reach os through a builtin
            return builtins.__import__, ("os",)
        return _Payload, ("custom", self.marker)


@pytest.mark.parametrize(
    "how, refused",
    [
        ("os.system", f"{os.system.__module__}.system"),
        ("subprocess", "subprocess.call"),
        ("eval", "builtins.eval"),
        ("import", "builtins.__import__"),
        ("custom", "_Payload"),
    ],
)
def test_code_payload_is_refused_and_does_not_run(tmp_path, how, refused) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps([("vid", 0.0, 1.0, "x"), _Payload(how, str(marker))]))
    with pytest.raises(UnsafePickle) as err:
        load_pickle(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and refused in message and "never" in message
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", None])
def test_truncated_or_foreign_file_one_line(tmp_path, content) -> None:
    path = tmp_path / "bad.pkl"
    whole = pickle.dumps(_data(), protocol=4)
    path.write_bytes(whole[: len(whole) // 2] if content is None else content)
    with pytest.raises(UnreadablePickle) as err:
        load_pickle(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and "not a readable pickle" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="pickle file not found"):
        load_pickle(tmp_path / "absent.pkl")
