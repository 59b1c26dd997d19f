"""Atomic file output and manifests (SPEC §7), and quiet native output. No torch import.

Contract: `atomic_output(path)` yields a temporary path in the destination directory; on a clean
exit it is renamed over `path` (atomic on POSIX), on any exception it is removed, so a final name
only ever holds a complete file. `write_manifest` writes `<artifact>.json` the same way.
`native_output_captured()` keeps native code's writes to fds 1 and 2 off the terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from psa_edge.errors import OutputError


def check_writable_dir(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"output directory {parent} is not writable")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    path = Path(path)
    check_writable_dir(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_marked_block(path: str | os.PathLike, name: str, block: str) -> None:
    """Replace the text between `<!-- name:begin -->` and `<!-- name:end -->` in a document
    (the README's generated tables), atomically; the markers must be there."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = Path(path).read_text()
    if begin not in text or end not in text:
        raise OutputError(f"{path} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    write_text(path, head + begin + "\n" + block.rstrip("\n") + "\n" + end
               + rest.split(end, 1)[1])


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_path(artifact: str | os.PathLike) -> Path:
    return Path(f"{artifact}.json")


def write_manifest(artifact: str | os.PathLike, fields: dict) -> dict:
    manifest = {"artifact": Path(artifact).name, "artifact_sha256": sha256_file(artifact),
                **fields}
    write_json(manifest_path(artifact), manifest)
    return manifest


def versions() -> dict:
    """Versions of psa-edge and the export stack, read from package metadata (no imports)."""
    from importlib import metadata

    out = {}
    for dist in ("psa-edge", "torch", "onnx", "onnxruntime", "executorch", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


@contextlib.contextmanager
def native_output_captured():
    """Native code (ExecuTorch's C++ runtime) writes to file descriptors 1 and 2 directly: its
    logs would break `--json` on stdout and bury a one-line error. Both point at a temporary
    file meanwhile; the yielded list receives the captured lines on exit, so a caller can name
    the native reason of a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    lines: list[str] = []
    with tempfile.TemporaryFile() as log:
        try:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            yield lines
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            log.seek(0)
            lines.extend(line for line in log.read().decode(errors="replace").splitlines()
                         if line.strip())
