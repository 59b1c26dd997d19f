"""Opening an artifact without risking the user's process: a checked first open (numpy only).

Contract:
- A native runtime (ExecuTorch above all) may abort the whole process on a corrupt program, and
  a weight changed under a re-computed manifest hash runs silently wrong. So the first time this
  machine opens an artifact's bytes, `ensure_checked(artifact)` opens them in a child process
  (`python -m psa_edge.runtime.session`) that loads the program, feeds the manifest's
  `self_check` tokens and compares the logits' fingerprint with the one recorded at export.
  A child that dies by a signal, hangs past CHILD_TIMEOUT_S or reports a mismatch becomes one
  `ArtifactError` here; the user's process never loads what the child could not.
- Bytes that passed (or that this machine exported: `mark_checked`) are remembered by sha256
  in `checked.txt` under `$PSA_EDGE_CACHE` (default `~/.cache/psa-edge`), so later opens cost
  nothing; an unwritable cache only means the check runs again. Cost measured in
  docs/results/reliability.md.
- `fingerprint(logits)`: per position the max, mean and standard deviation of the logits;
  two fingerprints agree within SELF_CHECK_RTOL of the logit scale (the tolerance thread
  counts and instruction sets never reach; a changed weight that stays inside it changes no
  output that matters).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError

SELF_CHECK_LEN = 8
SELF_CHECK_RTOL = 1e-3
CHILD_TIMEOUT_S = 300  # loading the largest preset takes seconds; past this it hangs


def cache_file() -> Path:
    root = os.environ.get("PSA_EDGE_CACHE") or Path.home() / ".cache" / "psa-edge"
    return Path(root) / "checked.txt"


def is_checked(identity: str) -> bool:
    try:
        return identity in cache_file().read_text().split()
    except (OSError, UnicodeDecodeError):
        return False


def mark_checked(identity: str) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # one short append: atomic between writers
            f.write(identity + "\n")
    except OSError:
        pass


def fingerprint(logits: np.ndarray) -> list[list[float]]:
    logits = np.asarray(logits, dtype=np.float64)
    return np.stack([logits.max(-1), logits.mean(-1), logits.std(-1)], -1).round(6).tolist()


def self_check_record(session) -> dict:
    """What export stores in the manifest: the tokens and the artifact's own fingerprint."""
    tokens = np.random.default_rng(0).integers(0, session.io.vocab_size,
                                               size=min(SELF_CHECK_LEN, session.io.max_seq_len))
    session.reset()
    record = {"tokens": tokens.tolist(), "fingerprint": fingerprint(session.feed(tokens))}
    session.reset()
    return record


def self_check(session) -> None:
    """Feed the manifest's self-check tokens; refuse logits unlike those recorded at export."""
    record = session.manifest.get("self_check")
    if record is None:  # an artifact from before self-checks: run it once, compare nothing
        session.feed(np.zeros(1, dtype=np.int64))
        return
    try:
        tokens = np.asarray(record["tokens"], dtype=np.int64)
        expected = np.asarray(record["fingerprint"], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise ArtifactError("the manifest's self_check is malformed")
    if expected.shape != (tokens.size, 3) or not np.isfinite(expected).all():
        raise ArtifactError("the manifest's self_check is malformed")
    got = np.asarray(fingerprint(session.feed(tokens)))
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(got - expected).max()) if np.isfinite(got).all() else float("inf")
    session.reset()
    if error > SELF_CHECK_RTOL * scale:
        raise ArtifactError(f"{session.manifest.get('target')} artifact does not reproduce its "
                            f"export-time outputs (fingerprint differs by {error:.3g}): the "
                            f"model file is corrupt or was changed")


def ensure_checked(artifact) -> None:
    """Open `artifact` (an `io.Artifact`) in a child process once per machine and bytes."""
    if is_checked(artifact.identity):
        return
    command = [sys.executable, "-m", "psa_edge.runtime.session", str(artifact.folder),
               artifact.identity]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    try:
        child = subprocess.run(command, capture_output=True, text=True, env=env,
                               timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ArtifactError(f"{artifact.model_path} did not load within {CHILD_TIMEOUT_S} s")
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        raise ArtifactError(f"the {artifact.manifest.get('backend')} runtime crashed ({name}) "
                            f"loading {artifact.model_path}: the file is corrupt")
    if child.returncode:
        lines = [line for line in child.stderr.splitlines() if line.strip()]
        reason = lines[-1].removeprefix("error: ") if lines else f"exit {child.returncode}"
        raise ArtifactError(reason)
    mark_checked(artifact.identity)
