"""libx264 options shared by every H.264 writer here (chunks, synthetic sources): reproducible bytes.

x264's AVX-512 code paths make its output vary run to run on the same frames (measured on an AMD EPYC
with AVX-512, PyAV 18 / libx264 as bundled: about one chunking run in six re-encoded some chunk with
other bytes, one frame up to 23/255 apart, from byte-identical input frames; with x264's assembly limited
to AVX2 and below, 80 of 80 runs gave identical bytes). On a CPU that has AVX-512 the writers therefore
name x264's instruction sets explicitly, AVX-512 left out; every CPU with AVX-512 has all of the sets
named. Elsewhere x264 detects the CPU itself. The price: x264 encodes 1.07-1.12x slower at 320 px
(``bench/x264_asm.py``, BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# x264 instruction-set names (x264_cpu_names) up to AVX2: all present on any CPU that has AVX-512F
_ASM_WITHOUT_AVX512 = "MMX2,SSE,SSE2,SSE2Fast,LZCNT,SSE3,SSSE3,SSE4.1,SSE4.2,AVX,FMA3,BMI1,BMI2,AVX2,Cache64"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@functools.cache
def x264_options() -> dict[str, str]:
    """Extra libx264 options for this machine: ``{"x264-params": "asm=..."}`` without AVX-512 on an
    x86-64 CPU that has it; ``{}`` elsewhere (x264's own detection)."""
    return x264_options_for(platform.machine(), cpu_flags())


def x264_options_for(machine: str, flags: frozenset[str]) -> dict[str, str]:
    """:func:`x264_options` for a given machine name and CPU flag set (testable on any CPU)."""
    if machine.lower() in ("x86_64", "amd64") and "avx512f" in flags:
        return {"x264-params": f"asm={_ASM_WITHOUT_AVX512}"}
    return {}


def describe_x264() -> str:
    """One line for logs: which x264 instruction sets the writers use here, and why."""
    if x264_options():
        return "libx264 with AVX2 and below (this CPU's AVX-512 left out: x264's AVX-512 output varies run to run)"
    return "libx264 with its own CPU detection"
