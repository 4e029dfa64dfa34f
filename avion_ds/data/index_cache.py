"""Flat, memory-mapped index files built once from annotation inputs and cached next to them.

Millions of annotation rows held as Python objects cost gigabytes per process and are copied page
by page into every forked DataLoader worker (reference counts write to them). An index here is a
set of numpy arrays (strings as one byte buffer + offsets) in ONE file, mapped read-only: every
rank and worker on a machine shares its pages, and a start reads no input file.

File layout (no pickle anywhere): a fixed part ``magic, version, header length, header crc32, data
crc32, data length``, a JSON header (``kind``, the inputs' ``key``, the arrays' dtype / shape /
offset, free ``meta``), then the arrays, 64-byte aligned. An index is used only when all of it
checks: magic, version, both checksums, the file size, no object dtype, and the key (every input's
resolved path, size and content digest) equal to the inputs' now; otherwise it is rebuilt (one log line
says why) and replaced atomically (temp file + rename). The digest is of the bytes, not the mtime: an
input edited with its size and mtime restored is rebuilt too. It is a SHA-256 read in 4 MiB blocks
(hardware SHA on x86-64 and ARMv8: 300 MB in 0.35 s on one core of this project's CI VM, where
blake2b takes 0.7 s and crc32 0.1 s), paid once per start per input. Concurrent builders (ranks starting
together) wait on a lock file, so one builds and the others map its result.

Where: beside the first input (``<input>.<kind>-<digest>.index``); when that directory is not
writable, under ``$XDG_CACHE_HOME/avion_ds/index`` (default ``~/.cache``), said in one log line;
when neither is, the index stays in memory, said in one line naming both directories.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import logging
import mmap
import os
import struct
import tempfile
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Self

import numpy as np

log = logging.getLogger(__name__)
MAGIC = b"AVDSIDX\x00"
VERSION = 2  # 2: the key holds a content digest of each input (1: its mtime)
_FIXED = struct.Struct("<8sIIIIQ")  # magic, version, header length, header crc32, data crc32, data length
_ALIGN = 64
_READ_BLOCK = 1 << 24
_HASH_BLOCK = 1 << 22  # 4 MiB: 1-8 MiB blocks hash at the same speed
_SPILL_BYTES = 1 << 23  # a spilling StringPacker's buffer, at most (8 MiB)
DIGEST = "sha256"
_KINDS = set("biuf")  # bool, signed / unsigned integers, floats: never objects
Arrays = dict[str, np.ndarray]


def content_digest(path: Path) -> str:
    """``sha256:<hex>`` of the bytes of ``path``, read in 4 MiB blocks (speed: module doc)."""
    h = hashlib.new(DIGEST)
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    with Path(path).open("rb") as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return f"{DIGEST}:{h.hexdigest()}"


def source_key(paths: list[Path]) -> list[list[Any]]:
    """[resolved path, size, content digest] of every input: an index is valid only for exactly these
    bytes (an edit that restores the size and mtime still changes the key; a touch alone does not)."""
    return [[str(Path(p).resolve()), Path(p).stat().st_size, content_digest(p)] for p in paths]


def cache_dir() -> Path:
    """The fallback cache directory: ``$XDG_CACHE_HOME/avion_ds/index`` (default ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "avion_ds" / "index"


def index_paths(kind: str, paths: list[Path]) -> tuple[Path, Path]:
    """(beside the first input, in :func:`cache_dir`) for the index of ``kind`` over ``paths``."""
    first = Path(paths[0]).resolve()
    digest = hashlib.sha1("\n".join(str(Path(p).resolve()) for p in paths).encode()).hexdigest()[:12]
    name = f"{first.name}.{kind}-{digest}.index"
    return first.with_name(name), cache_dir() / name


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _crc_file(f: Any, start: int, length: int) -> int:
    """crc32 of ``length`` bytes from ``start`` read through a buffer (the pages stay out of our RSS)."""
    f.seek(start)
    crc, buf = 0, bytearray(min(_READ_BLOCK, max(length, 1)))
    view = memoryview(buf)
    while length > 0:
        n = f.readinto(view[: min(len(buf), length)])
        if not n:
            break
        crc, length = zlib.crc32(view[:n], crc), length - n
    return crc


def write_index(path: Path, kind: str, key: list, arrays: Arrays, meta: dict) -> None:
    """Write ``arrays`` (+ ``meta``, JSON) as the index of ``kind`` (``name/layout version``) for ``key``
    (temp file + rename)."""
    table, offset = {}, 0
    for name, a in arrays.items():
        if not isinstance(a, SpilledBytes):
            a = np.ascontiguousarray(a)
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"index array {name!r} has dtype {a.dtype} (numbers only)")
        table[name] = [a.dtype.str, list(a.shape), offset]
        arrays[name], offset = a, _aligned(offset + a.nbytes)
    header = json.dumps({"kind": kind, "key": key, "arrays": table, "meta": meta}).encode()
    data_start = _aligned(_FIXED.size + len(header))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(b"\0" * data_start)
            crc = 0
            for name, a in arrays.items():
                f.seek(data_start + table[name][2])
                for raw in (
                    a.blocks() if isinstance(a, SpilledBytes) else [memoryview(a).cast("B") if a.nbytes else b""]
                ):
                    f.write(raw)
                    crc = zlib.crc32(raw, crc)
                pad = _aligned(a.nbytes) - a.nbytes
                crc = zlib.crc32(b"\0" * pad, crc)
            f.truncate(data_start + offset)
            f.seek(0)
            f.write(_FIXED.pack(MAGIC, VERSION, len(header), zlib.crc32(header), crc, offset) + header)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_index(path: Path, kind: str, key: list) -> tuple[Arrays, dict] | str:
    """The arrays (mapped read-only) and meta of a valid index, or why ``path`` is not one."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return "absent"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    with f:
        fixed = f.read(_FIXED.size)
        if len(fixed) < _FIXED.size:
            return "corrupt (truncated header)"
        magic, version, hlen, hcrc, dcrc, dlen = _FIXED.unpack(fixed)
        if magic != MAGIC or version != VERSION:
            return "not an index of this version"
        raw = f.read(hlen)
        if len(raw) != hlen or zlib.crc32(raw) != hcrc:
            return "corrupt (header checksum)"
        try:
            header = json.loads(raw)
            table, meta, got_kind, got_key = header["arrays"], header["meta"], header["kind"], header["key"]
        except (ValueError, KeyError, TypeError):
            return "corrupt (header)"
        if got_kind != kind:
            return "written by another version"
        if got_key != key:
            return "stale (its inputs changed)"
        start = _aligned(_FIXED.size + hlen)
        if os.fstat(f.fileno()).st_size != start + dlen:
            return "corrupt (size)"
        if _crc_file(f, start, dlen) != dcrc:
            return "corrupt (data checksum)"
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if start + dlen else None
    arrays = {}
    try:
        for name, (dtype, shape, offset) in table.items():
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if dt.kind not in _KINDS or offset < 0 or offset + count * dt.itemsize > dlen:
                return f"corrupt (array {name})"
            arrays[name] = np.frombuffer(mm, dt, count, start + offset).reshape(shape) if count else np.empty(shape, dt)
    except (TypeError, ValueError):
        return "corrupt (array table)"
    return arrays, meta


class _Lock:
    """An exclusive ``flock`` on ``path`` (created) for the duration of a ``with`` block."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)

    def __enter__(self) -> Self:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOENT)


class MappedIndex:
    """The arrays of one index (``arrays``, ``meta``) and the file they map (``path``; None: in memory).

    Pickles as its path (a spawned worker maps the same file again, after the same checks)."""

    def __init__(self, kind: str, key: list, path: Path | None, arrays: Arrays, meta: dict) -> None:
        self.kind, self.key, self.path, self.arrays, self.meta = kind, key, path, arrays, meta

    def __getstate__(self) -> dict:
        if self.path is None:
            return dict(self.__dict__)
        return {"kind": self.kind, "key": self.key, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "arrays" not in state:
            got = read_index(self.path, self.kind, self.key)
            if isinstance(got, str):
                raise ValueError(f"{self.path}: index changed under a running job: {got}")
            self.arrays, self.meta = got


def _refusal(e: OSError, target: Path) -> str:
    """``dir (reason)`` when ``e`` says the cache directory of ``target`` is not writable; else re-raise ``e``."""
    if e.errno not in _NOT_WRITABLE:
        raise e
    return f"{target.parent} ({e.strerror or e})"


def _write_where(
    kind: str, key: list, targets: tuple[Path, Path], build: Callable[[], tuple[Arrays, dict]]
) -> tuple[MappedIndex | None, tuple[Arrays, dict] | None, list[str]]:
    """Build (once) and write the index to the first writable target: (mapped index or None, what was
    built, ``dir (reason)`` of each target that refused)."""
    built: tuple[Arrays, dict] | None = None
    refused: list[str] = []
    for target in targets:
        try:
            lock = _Lock(target.with_name(target.name + ".lock"))
        except OSError as e:
            refused.append(_refusal(e, target))
            continue
        with lock:
            got = read_index(target, kind, key)  # another rank may have built it while we waited
            if not isinstance(got, str):
                return MappedIndex(kind, key, target, *got), built, refused
            built = built or build()  # bad input raises here: nothing is cached
            try:
                write_index(target, kind, key, dict(built[0]), built[1])
            except OSError as e:
                refused.append(_refusal(e, target))
                continue
        got = read_index(target, kind, key)
        if not isinstance(got, str):
            return MappedIndex(kind, key, target, *got), built, refused
        refused.append(f"{target.parent} (written but unreadable: {got})")
    return None, built, refused


def cached_index(kind: str, layout: int, paths: list[Path], build: Callable[[], tuple[Arrays, dict]]) -> MappedIndex:
    """The index of ``kind`` over the input files ``paths``: mapped from the cache when valid (same
    ``layout``: the builder's version of its arrays), else built with ``build()`` (which raises on bad
    input: nothing is cached then) and cached (module doc)."""
    key = source_key(paths)
    beside, fallback = index_paths(kind, paths)
    name, kind = kind, f"{kind}/{layout}"
    for target in (beside, fallback):
        got = read_index(target, kind, key)
        if not isinstance(got, str):
            return MappedIndex(kind, key, target, *got)
        if got != "absent":
            (log.warning if got.startswith("corrupt") else log.info)(
                "%s: rebuilding the %s index: %s", target, name, got
            )
        if target == beside and os.access(beside.parent, os.W_OK):
            break  # the place to write it is beside the input: no need to look in the fallback
    index, built, refused = _write_where(kind, key, (beside, fallback), build)
    if index is not None:
        if index.path != beside:
            log.warning("%s is not writable: caching the %s index in %s", beside.parent, name, fallback.parent)
        return index
    log.warning(
        "no writable place for the %s index of %s: %s; keeping it in memory for this run",
        name,
        paths[0],
        " and ".join(refused),
    )
    arrays, meta = built or build()
    held = {name: a.load() if isinstance(a, SpilledBytes) else a for name, a in arrays.items()}
    return MappedIndex(kind, key, None, held, meta)


def pack_strings(strings: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(utf-8 bytes of all ``strings`` one after another, offsets (len + 1)): one buffer, no objects."""
    packer = StringPacker()
    for s in strings:
        packer.add(s)
    return packer.arrays()


class SpilledBytes:
    """A uint8 column kept in a temporary file as it grew (a cold build's string buffer):
    :func:`write_index` copies it in blocks instead of from memory."""

    dtype = np.dtype(np.uint8)

    def __init__(self, f: Any, nbytes: int) -> None:
        self.f, self.nbytes, self.shape = f, nbytes, (nbytes,)

    def blocks(self) -> Iterator[bytes]:
        """The bytes, in order, a block at a time."""
        self.f.seek(0)
        left = self.nbytes
        while left > 0:
            block = self.f.read(min(_HASH_BLOCK, left))
            if not block:
                raise OSError(f"spilled column: {left} bytes missing from its temporary file")
            left -= len(block)
            yield block

    def load(self) -> np.ndarray:
        """The bytes held in memory (the index kept for the run when no cache directory is writable)."""
        self.f.seek(0)
        data = self.f.read(self.nbytes)
        if len(data) != self.nbytes:
            raise OSError(f"spilled column: {self.nbytes - len(data)} bytes missing from its temporary file")
        return np.frombuffer(data, np.uint8)


class StringPacker:
    """:func:`pack_strings` one string at a time: the bytes grow in one buffer, no string is kept. With
    ``spill``, the buffer goes to a temporary file (``$TMPDIR``) every ``_SPILL_BYTES``, so a cold build holds
    the offsets and one block (4M Ego4D narrations: ~170 MiB of text)."""

    def __init__(self, spill: bool = False) -> None:
        self.buf, self.off = bytearray(), array("q", [0])
        self.file: Any = None
        self.spilled = 0  # bytes in the file
        self.limit = _SPILL_BYTES if spill else float("inf")

    def add(self, s: str) -> None:
        """Append ``s`` (utf-8, lone surrogates kept)."""
        self.buf += s.encode("utf-8", "surrogatepass")
        self.off.append(self.spilled + len(self.buf))
        if len(self.buf) >= self.limit:
            self._spill()

    def _spill(self) -> None:
        if self.file is None:  # the column's file, removed when closed (when the column goes)
            self.file = tempfile.TemporaryFile(prefix="avion_ds_strings_")  # noqa: SIM115
        self.file.write(self.buf)
        self.spilled += len(self.buf)
        self.buf = bytearray()

    def __len__(self) -> int:
        return len(self.off) - 1

    def arrays(self) -> tuple[np.ndarray | SpilledBytes, np.ndarray]:
        """(bytes, offsets) sharing this packer's memory (no copy; add nothing after); the bytes as
        :class:`SpilledBytes` once any went to the file."""
        if self.file is None:
            return np.frombuffer(self.buf, np.uint8), np.frombuffer(self.off, np.int64)
        self._spill()
        self.file.flush()
        return SpilledBytes(self.file, self.spilled), np.frombuffer(self.off, np.int64)


def take_strings(
    buf: np.ndarray, off: np.ndarray, rows: np.ndarray, block: int = 1 << 12
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets) of strings ``rows`` (in that order) of a packed (``buf``, ``off``), gathered ``block``
    strings at a time (the byte index of a block, not of all, is held)."""
    rows = np.asarray(rows, np.int64)
    first, size = off[rows], off[rows + 1] - off[rows]
    new_off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(size, out=new_off[1:])
    out = np.empty(int(new_off[-1]), np.uint8)
    for lo in range(0, len(rows), block):
        hi = min(lo + block, len(rows))
        a, b = int(new_off[lo]), int(new_off[hi])
        shift = np.repeat(first[lo:hi] - new_off[lo:hi], size[lo:hi])
        out[a:b] = buf[shift + np.arange(a, b)]
    return out, new_off


class Strings:
    """Read-only sequence over :func:`pack_strings`' (buffer, offsets): item ``k`` decoded on access."""

    def __init__(self, buf: np.ndarray, off: np.ndarray) -> None:
        self.buf, self.off = buf, off
        self.raw, self._off = memoryview(buf), memoryview(off)  # item reads without numpy scalars

    def __reduce__(self) -> tuple:
        return Strings, (self.buf, self.off)

    def __len__(self) -> int:
        return len(self.off) - 1

    def __getitem__(self, k: int) -> str:
        return str(self.raw[self._off[k] : self._off[k + 1]], "utf-8", "surrogatepass")

    def tolist(self) -> list[str]:
        """Every string (for small columns: video ids, file names)."""
        data, off = self.buf.tobytes(), self.off.tolist()
        return [data[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(off)]
