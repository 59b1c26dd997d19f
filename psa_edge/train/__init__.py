"""Training and evaluation: `trainer` (the deterministic loop) and `run` (the commands' files).

This module itself does not import torch: the command line checks a device name against it
before the command pays for torch's import."""

from __future__ import annotations

import re

from psa_edge.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: the N-th GPU, counted from 0


def check_device(name: str) -> None:
    """Refuse a device name the trainer does not take; whether that device is here is torch's
    to say (`trainer.resolve_device`)."""
    if name not in DEVICES[:-1] and re.fullmatch(r"cuda:\d+", name) is None:
        raise ConfigError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
