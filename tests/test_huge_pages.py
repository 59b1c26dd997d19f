"""`backends.huge_pages`: which stretches it collapses, that it keeps every byte, and that it
makes no page resident that was not (read back from the kernel's own /proc files)."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import sys

import numpy as np
import pytest

from psa_edge.backends import huge_pages

MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 123 /usr/bin/python3.11
55d0c2000000-55d0c4000000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
7f0000800000-7f0000a00000 rw-s 00000000 00:05 77 /dev/zero (deleted)
7f0000a00000-7f0000c00000 r--p 00000000 00:00 0
7f0000c00000-7f0000e00000 rw-p 00001000 08:01 124 /usr/lib/libfoo.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
"""


def test_only_private_writable_anonymous_mappings_are_candidates():
    assert huge_pages.anonymous_ranges(MAPS) == [(0x55d0c2000000, 0x55d0c4000000),
                                                 (0x7f0000000000, 0x7f0000800000)]


def test_adjacent_stretches_merge_into_one_call():
    mib = 1 << 20
    assert huge_pages.runs([0, 2 * mib, 4 * mib, 10 * mib], 2 * mib) == [(0, 6 * mib),
                                                                        (10 * mib, 2 * mib)]
    assert huge_pages.runs([], 2 * mib) == []


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PSA_EDGE_HUGE_PAGES", "0")
    assert huge_pages.collapse_resident_memory() == 0


def present_pages(address: int, length: int) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        entries = np.frombuffer(os.pread(fd, length // page * 8, address // page * 8), np.uint64)
    finally:
        os.close(fd)
    return int(((entries & huge_pages.PRESENT) != 0).sum())


def anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


def collapse_supported() -> bool:
    """Linux 6.1 or later (MADV_COLLAPSE) with transparent huge pages not turned off."""
    if sys.platform != "linux":
        return False
    release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    return release >= (6, 1) and huge_pages.thp_setting() in ("always", "madvise")


def thp_always() -> bool:
    return huge_pages.thp_setting() == "always"


@pytest.mark.skipif(not collapse_supported(), reason="needs Linux 6.1+ with THP not off")
def test_collapses_dense_stretches_keeps_bytes_and_leaves_sparse_ones_alone():
    _, huge = huge_pages.resident_stretches()
    # Private anonymous memory (mmap's default is shared), 4 huge pages of it aligned inside.
    memory = mmap.mmap(-1, 5 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    start = -(-base // huge) * huge
    offset = start - base
    dense = np.frombuffer(memory, np.uint8, 2 * huge, offset)
    dense[:] = np.arange(dense.size) % 251  # every page of two stretches resident
    sparse = np.frombuffer(memory, np.uint8, 2 * huge, offset + 2 * huge)
    sparse[::huge // 4] = 7  # four pages in each of the next two
    # 8 resident pages; with THP "always" the kernel already faulted whole huge pages in.
    before = present_pages(start + 2 * huge, 2 * huge)

    held_before = huge_pages.resident_now()  # as a backend takes it before a load
    huge_pages.collapse_resident_memory(held_before)
    if not thp_always():  # (with "always" the kernel gave huge pages at the first touch)
        assert anon_huge_kib(start) == 0  # resident before: left as it was
    process_before = huge_pages.anon_huge_bytes()
    assert huge_pages.collapse_resident_memory() >= 2 * huge
    assert anon_huge_kib(start) >= 2 * huge // 1024  # the dense stretches are huge pages now
    # The process's total (smaps_rollup) is the sum over its mappings (smaps), and grew by
    # at least the two stretches where the kernel had not given huge pages at the first touch.
    first = huge_pages.anon_huge_bytes()
    summed = 1024 * sum(int(line.split()[1]) for line in open("/proc/self/smaps")
                        if line.startswith("AnonHugePages:"))
    second = huge_pages.anon_huge_bytes()  # (khugepaged may act between the reads)
    assert min(first, second) <= summed <= max(first, second)
    if not thp_always():
        assert huge_pages.anon_huge_bytes() - process_before >= 2 * huge
    assert present_pages(start + 2 * huge, 2 * huge) == before  # no hole was filled
    assert np.array_equal(dense, np.arange(dense.size) % 251)
    assert (sparse[::huge // 4] == 7).all() and sparse.sum() == 7 * 8
    del dense, sparse
    memory.close()


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="the kernel has no transparent huge pages")
def test_thp_setting_is_the_bracketed_choice():
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as enabled:
        text = enabled.read()
    assert f"[{huge_pages.thp_setting()}]" in text and text.count("[") == 1
