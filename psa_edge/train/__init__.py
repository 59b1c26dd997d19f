"""Training and evaluation: `trainer` (the deterministic loop) and `run` (the commands' files).

This module itself does not import torch: the command line checks a device name against it
before the command pays for torch's import. `check_spec` checks the options a training state
recorded (`train --resume`) by the bounds the command line's options take theirs from
(`psa_edge.TRAIN_RANGES`)."""

from __future__ import annotations

import re

from psa_edge import EXCLUSIVE_LOW, TRAIN_RANGES, is_integer, is_number
from psa_edge.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: the N-th GPU, counted from 0


def check_device(name: str) -> None:
    """Refuse a device name the trainer does not take; whether that device is here is torch's
    to say (`trainer.resolve_device`)."""
    if name not in DEVICES[:-1] and re.fullmatch(r"cuda:\d+", name) is None:
        raise ConfigError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")


OPTIONAL = {"gamma", "layers", "vocab_size", "stop_at"}  # None: the default
SPEC_KINDS = {"task": str, "preset": str, "variant": str, "device": str, "weights_dtype": str,
              "compile": bool, "task_params": dict, "config_overrides": dict, "text": list}


def check_spec(spec: dict, source: str) -> None:
    """Refuse a recorded training spec (a training state's) with a field missing, unknown, of
    the wrong type, out of range or naming nothing: what the command line refuses in the same
    options."""
    from psa_edge.model.config import PRESETS, VARIANTS, WEIGHT_DTYPES
    from psa_edge.tasks import TASKS

    fields = set(TRAIN_RANGES) | set(SPEC_KINDS)
    if set(spec) != fields:
        odd = sorted(fields - set(spec)) or sorted(map(str, set(spec) - fields))
        raise ConfigError(f"{source} records {'no' if fields - set(spec) else 'an unknown'} "
                          f"training option {odd[0]}")
    for name, kind in SPEC_KINDS.items():
        if not isinstance(spec[name], kind):
            raise ConfigError(f"{source} records {name} = {spec[name]!r}, not a "
                              f"{kind.__name__}")
    if not all(isinstance(path, str) for path in spec["text"]):
        raise ConfigError(f"{source} records a text path that is not a string")
    for name, known in (("task", [*TASKS, "text"]), ("preset", PRESETS),
                        ("variant", VARIANTS), ("weights_dtype", WEIGHT_DTYPES)):
        if spec[name] not in known:
            raise ConfigError(f"{source} records an unknown {name} {spec[name]!r}")
    check_device(spec["device"])
    for name, (low, high, kind) in TRAIN_RANGES.items():
        value = spec[name]
        if value is None and name in OPTIONAL:
            continue
        fits = (is_integer(value, low, high) if kind is int else is_number(value, low, high)
                and not (name in EXCLUSIVE_LOW and value == low))
        if not fits:
            raise ConfigError(f"{source} records {name} = {spec[name]!r}, not "
                              f"{'an integer' if kind is int else 'a number'} in "
                              f"{'(' if name in EXCLUSIVE_LOW else '['}{low}, {high}]")
