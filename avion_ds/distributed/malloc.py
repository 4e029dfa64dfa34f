"""glibc malloc settings (``mallopt``), the one place they are made.

Decoding processes (:func:`tune_malloc`): a clip's big frame buffers are reused, not re-faulted.

A clip's frames pass through 2-9 MB buffers (decord: its frame array, allocated on its own decode
thread, and the numpy copy; torchcodec / PyAV: the output tensor). With glibc's adaptive defaults
these keep coming back as fresh memory (a new mapping, or a thread arena trimmed after every clip),
and each 4 KiB page of fresh memory costs a zero-filling page fault. Fixed thresholds keep freed
buffers for reuse (faults per clip: ``bench/loader.py --parts faults``, BENCHMARKS.md). Applied in
DataLoader workers and the timeout helper; a no-op where the C library has no ``mallopt`` (musl,
macOS) and with ``AVION_DS_MALLOC_TUNE=0`` (e.g. with jemalloc / tcmalloc preloaded, or to measure).

Partitioned model construction (:func:`pin_mmap_threshold`): big tensors built and freed one module at
a time go back to the OS instead of staying resident as heap holes.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: buffers below it come from the heap / arenas
TRIM_THRESHOLD = 64 << 20  # free memory a heap or thread arena keeps before returning it (per process)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
ENV_SWITCH = "AVION_DS_MALLOC_TUNE"  # "0": leave malloc alone


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where the C library has none (or refuses)."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(fn(int(param), int(value)))


def tune_malloc() -> bool:
    """Apply the decoding thresholds to this process; True if the C library accepted them."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def pin_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Make glibc serve allocations >= ``nbytes`` with mmap and return them to the OS on free.

    glibc raises its mmap threshold after the first large free (up to 32 MiB), after which the
    full tensors that ``zero.Init`` creates and frees one module at a time come from the heap and
    stay resident as holes: measured on ViT-B, 2 ranks, per-rank build peak 0.73x of the fp32
    model instead of 0.57x, and 1.36x instead of 0.58x after loading. Setting the threshold
    explicitly turns the dynamic adjustment off (same as ``MALLOC_MMAP_THRESHOLD_``). Process-wide and
    idempotent; False where there is no glibc.
    """
    return mallopt(_M_MMAP_THRESHOLD, nbytes)
