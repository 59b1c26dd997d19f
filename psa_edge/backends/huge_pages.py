"""Transparent huge pages under a loaded model's weights (Linux, best effort; numpy, no torch).

Contract: `collapse_resident_memory()` asks the kernel to back every 2 MiB-aligned stretch of
this process's private anonymous memory that is wholly resident with one huge page
(`madvise(MADV_COLLAPSE)`, Linux 6.1 and later), and returns how many bytes it asked for. It
changes no address and no byte, and makes nothing resident that was not: a stretch with even
one page missing is left alone, because collapsing it would fill the hole. It does nothing and
returns 0 where it cannot run (not Linux, an older kernel, no /proc, THP turned off) and when
`PSA_EDGE_HUGE_PAGES=0`. The backends call it once a program or session has been loaded,
when its weights (XNNPACK's packed ones, ONNX Runtime's initializers) are in memory, passing
`resident_now()` as taken before the load so that only the load's own memory is copied.
`state()` says what a benchmark ran on: whether psa-edge collapses, the kernel's THP setting,
and the process's bytes on huge pages now (None where /proc cannot tell).

Why: a decode step reads every weight once, so behind 4 KiB pages it walks a page-table
entry per 4 KiB of weights, far more than the TLB holds; docs/reference/runtime.md measures
the gain.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import numpy as np

MADV_COLLAPSE = 25  # <linux/mman.h>, Linux 6.1
PRESENT = np.uint64(1) << np.uint64(63)  # /proc/self/pagemap: the page is in RAM
SCAN = 1 << 30  # address space whose pagemap entries are read at once (2 MiB of them)


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get("PSA_EDGE_HUGE_PAGES", "1") != "0"


def anonymous_ranges(maps: str) -> list[tuple[int, int]]:
    """(start, end) of the private, writable, anonymous mappings in a /proc/PID/maps text."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        path = fields[5] if len(fields) > 5 else ""
        if fields[1].startswith("rw") and fields[1][3] == "p" and path in ("", "[heap]"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def resident_huge_pages(pagemap_fd: int, start: int, end: int, page: int, huge: int
                        ) -> list[int]:
    """Addresses of the `huge`-aligned stretches in [start, end) whose pages are all in RAM."""
    low, high = -(-start // huge) * huge, end // huge * huge
    found = []
    for first in range(low, high, SCAN):  # a slice at a time: a mapping may span terabytes
        size = (min(first + SCAN, high) - first) // page * 8
        entries = np.frombuffer(os.pread(pagemap_fd, size, first // page * 8), dtype=np.uint64)
        if entries.size * 8 != size:
            return found
        present = ((entries & PRESENT) != 0).reshape(-1, huge // page).all(axis=1)
        found += [first + int(i) * huge for i in np.flatnonzero(present)]
    return found


def runs(addresses: list[int], huge: int) -> list[tuple[int, int]]:
    """Adjacent stretches merged into (start, length) runs: one call each."""
    merged: list[list[int]] = []
    for address in addresses:
        if merged and merged[-1][0] + merged[-1][1] == address:
            merged[-1][1] += huge
        else:
            merged.append([address, huge])
    return [(start, length) for start, length in merged]


def resident_stretches() -> tuple[list[int], int]:
    """The wholly resident huge-page stretches of this process and the huge page's size (the
    kernel's PMD size: 2 MiB under 4 KiB pages); none where /proc cannot tell."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as size:
            huge = int(size.read())
        with open("/proc/self/maps") as maps:
            ranges = anonymous_ranges(maps.read())
        page = os.sysconf("SC_PAGE_SIZE")
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            return [a for start, end in ranges
                    for a in resident_huge_pages(fd, start, end, page, huge)], huge
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return [], 0


def collapse_resident_memory(already: frozenset[int] = frozenset()) -> int:
    """Collapse the wholly resident stretches, except those in `already` (`resident_now()` taken
    before a load: only what the load made resident is copied); the bytes asked for."""
    if not enabled():
        return 0
    stretches, huge = resident_stretches()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    asked = 0
    for start, length in runs([a for a in stretches if a not in already], huge):
        if libc.madvise(start, length, MADV_COLLAPSE) != 0 and ctypes.get_errno() == errno.EINVAL:
            return asked  # EINVAL: this kernel has no MADV_COLLAPSE, or THP is off
        # Any other failure (EAGAIN, ENOMEM: no huge page free now) leaves small pages there.
        asked += length
    return asked


def resident_now() -> frozenset[int]:
    """The wholly resident stretches before a load, for `collapse_resident_memory(already=)`:
    collapsing the memory the process held before (torch's, the interpreter's) would copy
    hundreds of MB on a process's first load for no decode-time gain."""
    return frozenset(resident_stretches()[0]) if enabled() else frozenset()


def thp_setting() -> str | None:
    """The kernel's transparent huge page setting ("always", "madvise", "never"), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            text = setting.read()
    except OSError:
        return None
    chosen = text[text.find("[") + 1:text.find("]")] if "[" in text else ""
    return chosen or None


def anon_huge_bytes() -> int | None:
    """This process's anonymous memory on transparent huge pages now (AnonHugePages of
    /proc/self/smaps_rollup), or None where the kernel does not say."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def state() -> dict:
    """What a report records: {"collapse": psa-edge collapses loads, "thp": the kernel's
    setting, "anon_huge_bytes": the process's bytes on huge pages now}."""
    return {"collapse": enabled(), "thp": thp_setting(), "anon_huge_bytes": anon_huge_bytes()}
