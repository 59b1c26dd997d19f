"""Training and evaluation: `trainer` (the deterministic loop) and `run` (the commands' files).

This module itself does not import torch: the command line checks a device name against it
before the command pays for torch's import."""

from __future__ import annotations

import re

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: the N-th GPU, counted from 0


def known_device(name: str) -> bool:
    """Whether `name` is a device name the trainer takes (not whether that device is here)."""
    return name in DEVICES[:-1] or re.fullmatch(r"cuda:\d+", name) is not None
