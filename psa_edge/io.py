"""Files: atomic output, manifests, artifact folders, and quiet native output. No torch.

Contract:
- `atomic_output(path)` yields a temporary path in the destination directory; on a clean exit it
  is renamed over `path` (atomic on POSIX), on any exception it is removed, so a final name only
  ever holds a complete file. `atomic_directory(path)` does the same for a folder: an artifact
  and everything beside it (manifest, tokenizer) become visible in one rename.
- Files and folders get the permissions of the user's umask, as any tool's output would (the
  temporary names are created private).
- `read_artifact(path)` opens an artifact folder (or the model file inside it): its manifest,
  and the model's bytes, read once and checked against the manifest's sha256, so what a backend
  loads is exactly what was checked.
- `native_output_captured()` keeps native code's writes to fds 1 and 2 off the terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from psa_edge.contract import MANIFEST, MODEL_FILES
from psa_edge.errors import ArtifactError, OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def check_writable_dir(path: Path) -> None:
    parent = Path(path).parent
    if not parent.is_dir():
        raise OutputError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"output directory {parent} is not writable")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    path = Path(path)
    check_writable_dir(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def is_artifact_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike):
    """A temporary folder beside `path`, renamed to `path` on a clean exit (an artifact folder
    already there is replaced; anything else there is refused), removed on any exception."""
    path = Path(path)
    check_writable_dir(path)
    if path.exists() and not is_artifact_dir(path):
        raise OutputError(f"{path} exists and is not a psa-edge artifact folder; "
                          f"choose another output")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~UMASK)
        for child in tmp.iterdir():
            os.chmod(child, 0o666 & ~UMASK)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "artifact")
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(text)


def dumps(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=float) + "\n"


def write_json(path: str | os.PathLike, data) -> None:
    write_text(path, dumps(data))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_path(checkpoint: str | os.PathLike) -> Path:
    """The manifest beside a checkpoint file (`model.pt.json`)."""
    return Path(f"{checkpoint}.json")


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


@dataclass(frozen=True)
class Artifact:
    """An opened artifact folder: its manifest and the model file's checked bytes."""
    folder: Path
    manifest: dict
    data: bytes

    @property
    def model_path(self) -> Path:
        return self.folder / MODEL_FILES[self.manifest["target"]]

    @property
    def identity(self) -> str:
        return self.manifest["files"][self.model_path.name]

    def path(self, name: str) -> Path:
        return self.folder / name


def artifact_folder(path: str | os.PathLike) -> Path:
    """The artifact folder a user names: the folder itself or the model file inside it."""
    path = Path(path)
    if path.is_file() and path.name in MODEL_FILES.values() and is_artifact_dir(path.parent):
        return path.parent
    if is_artifact_dir(path):
        return path
    if not path.exists():
        raise ArtifactError(f"artifact {path} does not exist")
    raise ArtifactError(f"{path} is not a psa-edge artifact folder (no {MANIFEST} in it)")


def read_artifact(path: str | os.PathLike, check_hash: bool = True) -> Artifact:
    folder = artifact_folder(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"manifest {folder / MANIFEST} is not valid JSON ({exc})")
    if not isinstance(manifest, dict) or manifest.get("target") not in MODEL_FILES \
            or not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"{folder / MANIFEST} is not a psa-edge artifact manifest")
    model = folder / MODEL_FILES[manifest["target"]]
    try:
        data = model.read_bytes() if check_hash else b""
    except OSError as exc:
        raise ArtifactError(f"cannot read {model}: {exc.strerror}")
    if check_hash and manifest["files"].get(model.name) != sha256_bytes(data):
        raise ArtifactError(f"{MANIFEST} does not match {model} (sha256 differs)")
    return Artifact(folder, manifest, data)


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
