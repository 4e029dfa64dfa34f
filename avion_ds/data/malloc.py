"""glibc malloc settings for decoding processes: a clip's big frame buffers are reused, not re-faulted.

A clip's frames pass through 2-9 MB buffers (decord: its frame array, allocated on its own decode
thread, and the numpy copy; torchcodec / PyAV: the output tensor). With glibc's adaptive defaults
these keep coming back as fresh memory (a new mapping, or a thread arena trimmed after every clip),
and each 4 KiB page of fresh memory costs a zero-filling page fault. Fixed thresholds keep freed
buffers for reuse (bench/loader.py, testsrc2 clips: decord 1548 -> 569 minor faults per clip
in-process, 2070 -> 382 in the timeout helper). Applied in DataLoader workers and the timeout helper;
no-op where the C library has no ``mallopt`` (musl, macOS).
"""

from __future__ import annotations

import ctypes

MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: buffers below it come from the heap / arenas
TRIM_THRESHOLD = 64 << 20  # free memory a heap or thread arena keeps before returning it (per process)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def tune_malloc() -> bool:
    """Apply the thresholds to this process; True if the C library accepted them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
