"""Read annotation pickles (Ego4D narrations, EPIC-100 MIR relevancy) without running code from them.

``pickle.load`` calls whatever global a file names: a downloaded ``ego4d_train.pkl`` could run
``os.system``. :func:`load_pickle` resolves only the globals that plain data needs: Python's
containers and scalars, ``collections.OrderedDict``, and numpy's array / scalar / dtype
reconstruction (the names numpy 1.x and 2.x write, for every pickle protocol: ``_reconstruct``,
``_frombuffer``, ``scalar``, ``ndarray``, ``dtype``, and ``_codecs.encode`` limited to latin-1, which
protocol 2 uses for bytes). Any other global raises :class:`UnsafePickle` naming the file and the
global; a truncated file or one that is not a pickle raises :class:`UnreadablePickle`. Both are
``ValueError`` with a one-line message.
"""

from __future__ import annotations

import builtins
import codecs
import collections
import pickle
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

_BUILTINS = ("list", "dict", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "complex", "bool")
_LATIN1 = ("latin1", "latin-1", "latin_1", "iso-8859-1", "iso8859-1", "l1")


class UnsafePickle(ValueError):
    """A pickle naming a global outside the data allowlist (it could run code when unpickled)."""


class UnreadablePickle(ValueError):
    """A file that is not a complete pickle (truncated, empty, another format)."""


def _numpy_core() -> tuple[Any, Any]:
    """numpy's ``multiarray`` and ``numeric`` modules (``numpy._core`` in 2.x, ``numpy.core`` in 1.x)."""
    try:
        from numpy._core import multiarray, numeric  # lazy: numpy 2.x's name; which one exists depends on the numpy
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray, numeric  # lazy: numpy 1.x's name
    return multiarray, numeric


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes (latin-1 only)."""
    if not isinstance(text, str) or str(encoding).lower() not in _LATIN1:
        raise pickle.UnpicklingError(f"_codecs.encode is allowed only for latin-1 text, got {encoding!r}")
    return codecs.encode(text, "latin1", errors)


def _allowed() -> dict[tuple[str, str], Any]:
    """(module, name) -> object, for every global :func:`load_pickle` resolves."""
    multiarray, numeric = _numpy_core()
    out: dict[tuple[str, str], Any] = {}
    for module in ("builtins", "__builtin__"):  # protocol < 3 writes Python 2's module name
        out.update({(module, name): getattr(builtins, name) for name in _BUILTINS})
    out[("collections", "OrderedDict")] = collections.OrderedDict
    out[("_codecs", "encode")] = _latin1_encode
    out[("numpy", "ndarray")] = np.ndarray
    out[("numpy", "dtype")] = np.dtype
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        out[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        if hasattr(numeric, "_frombuffer"):
            out[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    return out


class _DataUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` only knows the data allowlist."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path
        self.allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafePickle(
                f"{self.path}: refused to unpickle global {module}.{name}: annotation and relevancy pickles "
                "hold only lists, tuples, strings, numbers and numpy arrays, and are never allowed to run code"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle(f"{self.path}: refused a persistent id {pid!r} (annotation pickles hold plain data)")


def load_pickle(path: str | Path) -> Any:
    """The object pickled in ``path``, resolving only plain-data globals (see module doc)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pickle file not found: {path}")
    with path.open("rb") as f:
        try:
            return _DataUnpickler(f, path).load()
        except UnsafePickle:
            raise
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
            struct.error,
            UnicodeDecodeError,
        ) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UnreadablePickle(
                f"{path}: not a readable pickle (truncated, or another format): {type(e).__name__}: {reason}"
            ) from None


class NotASequence(ValueError):
    """A pickle whose top-level object is not a list or tuple (``type_name`` names what it is)."""

    def __init__(self, path: Path, type_name: str) -> None:
        super().__init__(f"{path}: the pickled object is a {type_name}, not a list")
        self.type_name = type_name


def iter_pickle_items(path: str | Path, shared: tuple[int, ...] = ()) -> Iterator[Any]:
    """The items of the list pickled in ``path``, one at a time, without holding the list (a 4M-row Ego4D
    narration pickle is ~1 GiB of Python objects; streamed, the reader holds one batch of rows).

    The file is read by :class:`_ItemStream`, which builds plain data only (containers, strings, bytes,
    numbers; it never resolves a global) and drops an item from the pickle's memo once it has been handed
    over, with everything memoized for it, except the objects already referred to again and an item's
    elements at the positions ``shared`` lists (objects later items may refer to, e.g. a row's video uid at
    0, which the pickler wrote once for all of a video's rows). Anything it does not read (a global such as
    a numpy scalar, protocol 0's text opcodes, a top-level tuple, a later reference to a dropped object)
    hands over to :func:`load_pickle`: the rest of the same items, with its refusals and its one-line
    errors, the whole list held. A top-level object that is not a list or tuple raises :class:`NotASequence`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pickle file not found: {path}")
    done = 0
    try:
        with path.open("rb") as f:
            for item in _ItemStream(f, shared).items():
                done += 1
                yield item
        return
    except (_NotStreamed, IndexError, KeyError, TypeError, ValueError, struct.error):
        pass  # not read here, or malformed: load_pickle reads it or names the problem in one line
    data = load_pickle(path)
    if not isinstance(data, (list, tuple)):
        raise NotASequence(path, type(data).__name__)
    drop = isinstance(data, list)
    for k in range(done, len(data)):
        item = data[k]
        if drop:
            data[k] = None  # the list is the only copy: each item goes once handed over
        yield item


class _NotStreamed(Exception):
    """What :class:`_ItemStream` does not read: :func:`iter_pickle_items` falls back to :func:`load_pickle`."""


_TOP = object()  # the top-level list: its items are handed over, never appended
_BLOCK = 1 << 20
_U32, _I32, _U64, _F64 = struct.Struct("<I"), struct.Struct("<i"), struct.Struct("<Q"), struct.Struct(">d")


class _ItemStream:
    """A pickle reader for the binary protocols (1-5): the top-level list's items are handed over as their
    APPENDS arrive.

    Only plain-data opcodes are read (any other raises :class:`_NotStreamed`); the memo drops what each
    handed-over batch of items holds and later items will not refer to (:func:`iter_pickle_items`)."""

    def __init__(self, f: Any, shared: tuple[int, ...]) -> None:
        self.f, self.shared = f, shared
        self.buf, self.pos = b"", 0
        self.memo: dict[int, Any] = {}
        self.recent: list[int] = []  # memo keys set since the last hand-over
        self.hits: set[int] = set()  # memo keys read back at least once: shared objects, kept
        self.count = 0  # MEMOIZE's next key (protocol 4+); BINPUT (protocols 2-3) names its key
        self.saw_put = False  # a stream mixing BINPUT and MEMOIZE is not read here

    def fill(self, n: int) -> None:
        """At least ``n`` bytes after ``pos`` in the buffer, unless the file ends first."""
        if self.pos + n > len(self.buf):
            rest = self.buf[self.pos :]
            self.buf, self.pos = rest + self.f.read(max(_BLOCK, n - len(rest))), 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        self.fill(n)
        if self.pos + n > len(self.buf):
            raise _NotStreamed  # truncated: load_pickle names it
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def put(self, key: int, value: Any) -> None:
        """BINPUT / LONG_BINPUT (MEMOIZE is read inline)."""
        if self.count:
            raise _NotStreamed
        self.saw_put = True
        self.memo[key] = value
        self.recent.append(key)

    def get(self, key: int) -> Any:
        value = self.memo.get(key, _TOP)  # absent: dropped (shared, but not read back before) or never set
        if value is _TOP:  # ... or the top-level list itself, which is never built
            raise _NotStreamed
        self.hits.add(key)
        return value

    def handed_over(self, items: list[Any]) -> None:
        """Drop from the memo what was memoized since the last hand-over (``items``, their parts), except the
        objects already read back and the items' elements at the ``shared`` positions: a later reference to a
        dropped object hands over to :func:`load_pickle`."""
        memo, hits = self.memo, self.hits
        pending = [key for key in self.recent if key not in hits and key in memo]
        self.recent.clear()
        if not pending:
            return
        keep = {
            id(item[k])
            for item in items
            if type(item) is tuple or type(item) is list
            for k in self.shared
            if -len(item) <= k < len(item)
        }
        for key in pending:
            if id(memo[key]) not in keep:
                del memo[key]

    def items(self) -> Iterator[Any]:
        """Each item of the top-level list, in order. The opcodes of a row (text, floats, memo, tuple) are
        read inline, the rest through the tables below."""
        stack: list[Any] = []
        marks: list[int] = []
        push, memo, f64, u32 = stack.append, self.memo, _F64.unpack_from, _U32.unpack_from
        remember, count, saw_put, hit = self.recent.append, self.count, self.saw_put, self.hits.add
        buf, pos, limit = b"", 0, -16
        while True:
            if pos > limit:  # room for any opcode's fixed part; longer payloads go through take()
                self.buf, self.pos = buf, pos
                self.fill(16)
                buf, pos = self.buf, self.pos
                limit = len(buf) - 16
            op = buf[pos]
            pos += 1
            if op == 0x8C:  # SHORT_BINUNICODE
                n = buf[pos] + 1
                if pos + n <= limit:
                    push(buf[pos + 1 : pos + n].decode("utf-8", "surrogatepass"))
                    pos += n
                    continue
                self.pos = pos + 1
                push(self.take(n - 1).decode("utf-8", "surrogatepass"))
                buf, pos = self.buf, self.pos
                limit = len(buf) - 16
            elif op == 0x94:  # MEMOIZE
                if saw_put:
                    raise _NotStreamed
                memo[count] = stack[-1]
                remember(count)
                count += 1
            elif op == 0x47:  # BINFLOAT
                push(f64(buf, pos)[0])
                pos += 8
            elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                key = buf[pos] if op == 0x68 else u32(buf, pos)[0]
                pos += 1 if op == 0x68 else 4
                value = memo.get(key, _TOP)
                if value is _TOP:  # see get()
                    raise _NotStreamed
                hit(key)
                push(value)
            elif op == 0x28:  # MARK
                row = _avion_row(buf, pos, limit, memo) if not saw_put else None
                if row is None:
                    marks.append(len(stack))
                    continue
                pos, key, row = row  # MARK, uid GET, 2 BINFLOAT, text MEMOIZE, TUPLE MEMOIZE: one step
                hit(key)
                count += 2  # the text's and the row's memo keys, left empty: what a hand-over drops anyway
                push(row)
            elif op == 0x74:  # TUPLE
                k = marks.pop()
                t = tuple(stack[k:])
                del stack[k:]
                push(t)
            elif op == 0x65 or op == 0x61:  # APPENDS, APPEND
                k = marks.pop() if op == 0x65 else len(stack) - 1
                if k < 1:
                    raise _NotStreamed
                batch, target = stack[k:], stack[k - 1]
                del stack[k:]
                if target is _TOP:
                    yield from batch
                    self.handed_over(batch)
                elif type(target) is list:
                    target.extend(batch)
                else:
                    raise _NotStreamed
            else:
                self.buf, self.pos, self.count = buf, pos, count
                self.other(op, stack, marks)
                buf, pos, saw_put = self.buf, self.pos, self.saw_put
                limit = len(buf) - 16
                if op == 0x2E:  # STOP
                    return

    def other(self, op: int, stack: list[Any], marks: list[int]) -> None:
        """Every opcode :meth:`items` does not read inline (the buffer at ``self.buf`` / ``self.pos``)."""
        take = self.take
        if op in _SCALARS:
            stack.append(_SCALARS[op](take))
        elif op in _GETS:
            stack.append(self.get(_GETS[op](take)))
        elif op in _PUTS:
            self.put(_PUTS[op](take), stack[-1])
        elif op == 0x5D:  # EMPTY_LIST
            stack.append(_TOP if not stack else [])
        elif op in _BUILDS:
            k = marks.pop() if _BUILDS[op] is None else len(stack) - _BUILDS[op]
            if k < 0 or (marks and k < marks[-1]):  # fewer items than it takes above the last MARK
                raise _NotStreamed
            made = _build(op, stack[k:], stack[k - 1] if k else None)
            del stack[k:]
            if made is not None:
                stack.append(made)
        elif op == 0x80:  # PROTO
            take(1)
        elif op == 0x95:  # FRAME: frames are read through, like the C unpickler does
            take(8)
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or stack[0] is not _TOP or marks:
                raise _NotStreamed
        else:
            raise _NotStreamed  # a global, a reduce, protocol 0 text ops, ...


def _avion_row(buf: bytes, pos: int, limit: int, memo: dict[int, Any]) -> tuple[int, int, tuple] | None:
    """An AVION narration row after a MARK, read in one step when it is written as most rows are (protocol 4+:
    a uid already in the memo, two floats, a short text, the tuple): (position after it, the uid's memo key,
    the row); None for anything else (read opcode by opcode)."""
    if pos + 26 > limit:  # near the buffer's end: the opcodes one by one refill it
        return None
    op = buf[pos]
    if op == 0x68:  # BINGET
        key, p = buf[pos + 1], pos + 2
    elif op == 0x6A:  # LONG_BINGET
        key, p = _U32.unpack_from(buf, pos + 1)[0], pos + 5
    else:
        return None
    if buf[p] != 0x47 or buf[p + 9] != 0x47 or buf[p + 18] != 0x8C:  # BINFLOAT, BINFLOAT, SHORT_BINUNICODE
        return None
    end = p + 20 + buf[p + 19]
    if end > limit or buf[end : end + 3] != b"\x94t\x94" or key not in memo:  # MEMOIZE, TUPLE, MEMOIZE
        return None
    uid = memo[key]
    if uid is _TOP:
        return None
    text = buf[p + 20 : end].decode("utf-8", "surrogatepass")
    return end + 3, key, (uid, _F64.unpack_from(buf, p + 1)[0], _F64.unpack_from(buf, p + 10)[0], text)


def _short_text(take: Callable[[int], bytes], width: int) -> str:
    n = take(width)[0] if width == 1 else (_U32 if width == 4 else _U64).unpack(take(width))[0]
    return take(n).decode("utf-8", "surrogatepass")


def _sized_bytes(take: Callable[[int], bytes], width: int) -> bytes:
    n = take(width)[0] if width == 1 else (_U32 if width == 4 else _U64).unpack(take(width))[0]
    return take(n)


_SCALARS: dict[int, Callable[[Callable[[int], bytes]], Any]] = {
    0x8C: lambda t: _short_text(t, 1),  # SHORT_BINUNICODE
    0x58: lambda t: _short_text(t, 4),  # BINUNICODE
    0x8D: lambda t: _short_text(t, 8),  # BINUNICODE8
    0x43: lambda t: _sized_bytes(t, 1),  # SHORT_BINBYTES
    0x42: lambda t: _sized_bytes(t, 4),  # BINBYTES
    0x8E: lambda t: _sized_bytes(t, 8),  # BINBYTES8
    0x47: lambda t: _F64.unpack(t(8))[0],  # BINFLOAT
    0x4A: lambda t: _I32.unpack(t(4))[0],  # BININT
    0x4B: lambda t: t(1)[0],  # BININT1
    0x4D: lambda t: int.from_bytes(t(2), "little"),  # BININT2
    0x8A: lambda t: int.from_bytes(t(t(1)[0]), "little", signed=True),  # LONG1
    0x4E: lambda t: None,  # NONE
    0x88: lambda t: True,  # NEWTRUE
    0x89: lambda t: False,  # NEWFALSE
    0x29: lambda t: (),  # EMPTY_TUPLE
    0x7D: lambda t: {},  # EMPTY_DICT
    0x8F: lambda t: set(),  # EMPTY_SET
}
_GETS: dict[int, Callable[[Callable[[int], bytes]], int]] = {
    0x68: lambda t: t(1)[0],  # BINGET
    0x6A: lambda t: _U32.unpack(t(4))[0],  # LONG_BINGET
}
_PUTS = {0x71: _GETS[0x68], 0x72: _GETS[0x6A]}  # BINPUT, LONG_BINPUT
# opcode -> how many stack items it takes (None: down to the last MARK)
_BUILDS: dict[int, int | None] = {0x74: None, 0x85: 1, 0x86: 2, 0x87: 3, 0x6C: None, 0x75: None, 0x73: 2}
_BUILDS.update({0x90: None, 0x91: None, 0x30: 1, 0x31: None})


def _build(op: int, items: list[Any], below: Any) -> Any:
    """What a container opcode leaves on the stack from ``items`` (``below`` the object under them, which
    SETITEM(S) / ADDITEMS fill); None for nothing (POP, POP_MARK, a fill)."""
    if op in (0x74, 0x85, 0x86, 0x87):  # TUPLE, TUPLE1-3
        return tuple(items)
    if op == 0x6C:  # LIST
        return list(items)
    if op == 0x91:  # FROZENSET
        return frozenset(items)
    if op in (0x75, 0x73):  # SETITEMS, SETITEM
        if type(below) is not dict:
            raise _NotStreamed
        below.update(zip(items[::2], items[1::2]))
        return None
    if op == 0x90:  # ADDITEMS
        if type(below) is not set:
            raise _NotStreamed
        below.update(items)
        return None
    return None  # POP, POP_MARK
