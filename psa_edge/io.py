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

from psa_edge.contract import MANIFEST, MODEL_FILES, ONNX_DATA, check_manifest
from psa_edge.errors import ArtifactError, OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _temp_prefix(path: Path) -> str:
    # The writer's pid in the name lets a later writer remove what a killed one left.
    return f".{path.name}.{os.getpid()}."


def sweep_stale(path: Path) -> None:
    """Remove the temporary files and folders a killed writer of `path` left beside it."""
    head = f".{path.name}."
    with contextlib.suppress(OSError):
        for sibling in path.parent.iterdir():
            name = sibling.name
            if not (name.startswith(head) and name.endswith(".tmp")):
                continue
            pid = name[len(head):].split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                if sibling.is_dir() and not sibling.is_symlink():
                    shutil.rmtree(sibling, ignore_errors=True)
                else:
                    sibling.unlink(missing_ok=True)


def is_artifact_dir(path: Path) -> bool:
    """A folder to read as an artifact (`read_artifact` then checks its manifest)."""
    return path.is_dir() and (path / MANIFEST).is_file()


class WrittenHere:
    """The output rule for folders: a folder psa-edge may replace is one it can prove it wrote
    as `kind` ("artifact", "hf-export"): its manifest is psa-edge's, of that kind, and the
    folder holds exactly the regular files the manifest lists, and the manifest. A folder with
    any other file or a subfolder (a user's folder that happens to hold a manifest.json), or
    one of the other kind, is refused, never replaced."""

    def __init__(self, kind: str, what: str):
        self.kind, self.what = kind, what

    def __call__(self, path: Path) -> bool:
        if not path.is_dir() or path.is_symlink():
            return False
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return False
        if not isinstance(manifest, dict) or manifest.get("kind") != self.kind:
            return False
        files = manifest.get("files")
        if not isinstance(files, dict) or MANIFEST in files:
            return False
        entries = {entry.name: entry for entry in os.scandir(path)}
        return set(entries) == set(files) | {MANIFEST} and all(
            entry.is_file(follow_symlinks=False) for entry in entries.values())


ARTIFACT_FOLDER = WrittenHere("artifact", "artifact folder")
HF_EXPORT_FOLDER = WrittenHere("hf-export", "export-hf folder")


def check_output(path: str | os.PathLike, directory: bool = False,
                 replaceable=ARTIFACT_FOLDER) -> None:
    """Refuse an output that cannot be written: a missing or read-only parent; for a file, a
    directory or anything but a regular file at the path; for a folder, anything there that is
    not `replaceable` (by default an artifact folder psa-edge wrote, `WrittenHere`)."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"output directory {parent} does not exist")
    try:  # try it: os.access says yes to root on /proc or a read-only mount
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"output directory {parent} is not writable ({exc.strerror})")
    if not directory and path.is_dir():
        raise OutputError(f"{path} is a directory; name a file to write")
    if not directory and path.exists() and not path.is_file():
        raise OutputError(f"{path} exists and is not a regular file")
    if directory and (path.exists() or path.is_symlink()) and not replaceable(path):
        what = getattr(replaceable, "what", "folder psa-edge may replace")
        raise OutputError(f"{path} exists and is not an {what} psa-edge wrote (its manifest "
                          f"does not list exactly the files it holds); choose another output")
    sweep_stale(path)


def check_hf_output(path: str | os.PathLike) -> None:
    """`check_output` of an export-hf folder: what is there must be one export-hf wrote."""
    check_output(path, directory=True, replaceable=HF_EXPORT_FOLDER)


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why `path` is not a readable regular file, in a few words; None when it is one."""
    path = Path(path)
    if not os.path.lexists(path):
        return "does not exist"
    if path.is_symlink() and not path.exists():
        return "is a broken symlink or a symlink loop"
    if path.is_dir():
        return "is a directory, not a file"
    if not path.is_file():
        return "is not a regular file"
    return None


def refuse_overlap(outputs, inputs) -> None:
    """Refuse outputs that would replace an input: the same file, a folder holding one, or a
    file inside an input folder (an artifact)."""
    for output in outputs:
        target = Path(os.path.realpath(output))  # a symlink loop stays itself, no error
        for given in inputs:
            if given is None:
                continue
            source = Path(os.path.realpath(given))
            inside = source.is_dir() and source in target.parents
            if target == source or target in source.parents or inside:
                raise OutputError(f"output {output} would overwrite the input {given}; "
                                  f"choose another output")


def _cannot_write(path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {exc.strerror or exc}")


@contextlib.contextmanager
def atomic_outputs(*paths: str | os.PathLike):
    """Temporary files beside each of `paths`, renamed onto them in the order given on a clean
    exit; on any exception (a full disk, a signal turned into an exception) all are removed
    and nothing is renamed."""
    paths = [Path(p) for p in paths]
    for path in paths:
        check_output(path)
    temps: list[Path] = []
    try:
        for path in paths:
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
            os.close(fd)
            temps.append(Path(tmp))
        yield temps
        for tmp, path in zip(temps, paths):
            os.chmod(tmp, 0o666 & ~UMASK)
            os.replace(tmp, path)
    except BaseException as exc:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _cannot_write(paths[0], exc) from exc
        raise


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    with atomic_outputs(path) as (tmp,):
        yield tmp


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_cwd, exchange = -100, 2
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, replaceable=ARTIFACT_FOLDER):
    """A temporary folder beside `path`, put in its place on a clean exit, removed on any
    exception. What is at `path` already must be `replaceable` (by default an artifact folder);
    it is swapped out in one step where the kernel can (Linux), so a reader sees the old
    folder or the new one, never none."""
    path = Path(path)
    check_output(path, directory=True, replaceable=replaceable)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise _cannot_write(path, exc) from exc
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~UMASK)
        for child in tmp.iterdir():  # umask modes, keeping an executable executable
            if child.is_file():
                mode = 0o777 if child.stat().st_mode & 0o100 else 0o666
                os.chmod(child, mode & ~UMASK)
        if path.exists() and _exchange(tmp, path):
            old = tmp
        else:
            if path.exists():  # no exchange here: move the old folder aside first
                old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp",
                                            dir=path.parent))
                os.replace(path, old / "replaced")
            os.replace(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _cannot_write(path, exc) from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
    """An opened artifact folder: its manifest and the model file's checked bytes. An ONNX
    graph's weights (`ONNX_DATA`, where the manifest lists it) are hashed as a stream and left
    on disk for the runtime to map: they are not in `data`."""
    folder: Path
    manifest: dict
    data: bytes

    @property
    def model_path(self) -> Path:
        return self.folder / MODEL_FILES[self.manifest["target"]]

    @property
    def weights_path(self) -> Path | None:
        """The external weights beside the graph, or None (a .pte, or an older one-file ONNX)."""
        return self.folder / ONNX_DATA if ONNX_DATA in self.manifest["files"] else None

    @property
    def model_files(self) -> list[str]:
        return [p.name for p in (self.model_path, self.weights_path) if p is not None]

    @property
    def identity(self) -> str:
        """The model's files' sha256 (one file: its own digest)."""
        digests = [self.manifest["files"][name] for name in self.model_files]
        return digests[0] if len(digests) == 1 else sha256_bytes(" ".join(digests).encode())

    def path(self, name: str) -> Path:
        return self.folder / name

    def read(self, name: str) -> bytes:
        """A file of the folder, read once and checked against the manifest's sha256: what the
        caller uses is what was checked."""
        path = self.listed(name)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}")
        self.match(name, sha256_bytes(data))
        return data

    def check(self, name: str) -> None:
        """A file of the folder hashed as a stream (not held) against the manifest."""
        path = self.listed(name)
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}")
        self.match(name, digest)

    def listed(self, name: str) -> Path:
        """The path of a file the manifest lists, refused unless it is a regular file (a FIFO
        or a device in its place would block the read)."""
        path = self.folder / name
        if name not in self.manifest["files"]:
            raise ArtifactError(f"{self.folder / MANIFEST} lists no {name}")
        if (problem := not_a_file(path)) is not None:
            raise ArtifactError(f"{path} {problem}")
        return path

    def match(self, name: str, digest: str) -> None:
        if self.manifest["files"][name] != digest:
            raise ArtifactError(f"{MANIFEST} does not match {self.folder / name} (sha256 "
                                f"differs)")


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
        manifest = json.loads((folder / MANIFEST).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ArtifactError(f"manifest {folder / MANIFEST} is not valid JSON "
                            f"({str(exc)[:100]})")
    check_manifest(manifest, str(folder / MANIFEST))
    artifact = Artifact(folder, manifest, b"")
    if check_hash:
        artifact = Artifact(folder, manifest, artifact.read(MODEL_FILES[manifest["target"]]))
        if artifact.weights_path is not None:
            artifact.check(ONNX_DATA)
    return artifact


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
