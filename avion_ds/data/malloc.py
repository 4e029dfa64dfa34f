"""glibc malloc settings for decoding processes: a clip's big frame buffers are reused, not re-faulted.

A clip's frames pass through 2-9 MB buffers (decord: its frame array, allocated on its own decode
thread, and the numpy copy; torchcodec / PyAV: the output tensor). With glibc's adaptive defaults
these keep coming back as fresh memory (a new mapping, or a thread arena trimmed after every clip),
and each 4 KiB page of fresh memory costs a zero-filling page fault. Fixed thresholds keep freed
buffers for reuse (faults per clip: ``bench/loader.py --parts faults``, BENCHMARKS.md). Applied in
DataLoader workers and the timeout helper; a no-op where the C library has no ``mallopt`` (musl,
macOS) and with ``AVION_DS_MALLOC_TUNE=0`` (e.g. with jemalloc / tcmalloc preloaded, or to measure).
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: buffers below it come from the heap / arenas
TRIM_THRESHOLD = 64 << 20  # free memory a heap or thread arena keeps before returning it (per process)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
ENV_SWITCH = "AVION_DS_MALLOC_TUNE"  # "0": leave malloc alone


def tune_malloc() -> bool:
    """Apply the thresholds to this process; True if the C library accepted them."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
