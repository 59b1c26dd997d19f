"""`psa-edge bundle`: a self-contained folder to copy to a Raspberry Pi or an Android phone.

Contract: `write_bundle(artifacts, out)` checks every artifact against its manifest, then
writes into a temporary folder beside `out` and renames it into place (an existing non-empty
`out` is refused, a failure leaves nothing):
- `models/`: the artifact folders (model file, manifest, tokenizer);
- `psa_edge/`: the device runtime only (the CLI, `runtime/`, errors, io, tokenizer, display):
  numpy + onnxruntime + tokenizers (+ typer, rich for the CLI, jinja2 for `generate --chat`),
  ExecuTorch's runtime for a .pte; commands that need torch (train, export, ...) are not in
  it;
- `psa-edge`: a launcher (`python3 -m psa_edge.cli`);
- `requirements-onnx.txt` (aarch64 Linux: numpy, onnxruntime, tokenizers, typer, rich, jinja2,
  pinned to the versions this bundle was tested with) and, when a .pte is bundled,
  `requirements-executorch.txt` (the executorch wheel and the torch it needs);
- `README.md` (from the templates in `runtime/templates/`): the exact commands for a Raspberry
  Pi (64-bit OS) and for an Android phone (Termux + Python for the ONNX path; ExecuTorch's
  llama runner / benchmark app for a .pte);
- `bundle.json`: every file with its sha256.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path
from string import Template

from psa_edge.contract import get_form
from psa_edge.errors import OutputError
from psa_edge.io import artifact_folder, atomic_directory, read_artifact, sha256_file

PACKAGE = Path(__file__).resolve().parent.parent
TEMPLATES = PACKAGE / "runtime" / "templates"
RUNTIME_FILES = ["__init__.py", "errors.py", "io.py", "contract.py", "tokenizer.py",
                 "display.py", "cli.py", "backends/__init__.py", "backends/base.py",
                 "backends/onnxruntime.py", "backends/executorch.py", "backends/huge_pages.py",
                 "runtime/__init__.py", "runtime/session.py", "runtime/generate.py",
                 "runtime/speculative.py", "runtime/run.py", "runtime/bench.py",
                 "runtime/bundle.py", "runtime/guard.py", "runtime/templates/bundle-readme.md",
                 "runtime/templates/bundle-readme-pte.md",
                 "runtime/templates/bundle-readme-android.md",
                 "runtime/templates/bundle-readme-runner.md",
                 # verify against the reference logits recorded at export (reference.npz)
                 "checks/__init__.py", "checks/reference.py", "checks/verify.py"]
# jinja2 renders a chat template (`generate --chat`), imported only then.
ONNX_REQUIREMENTS = ("numpy", "onnxruntime", "tokenizers", "typer", "rich", "jinja2")
EXECUTORCH_REQUIREMENTS = ("executorch", "torch")


def pinned(names) -> str:
    lines = []
    for name in names:
        try:
            version = metadata.version(name).split("+")[0]  # 2.13.0+cpu -> 2.13.0
            lines.append(f"{name}=={version}")
        except metadata.PackageNotFoundError:
            lines.append(name)
    return "\n".join(lines) + "\n"


def write_bundle(artifacts: list[Path], out: Path) -> dict:
    out = Path(out)
    if not artifacts:
        raise OutputError("give at least one artifact to bundle")
    artifacts = [artifact_folder(a) for a in artifacts]
    manifests = [read_artifact(a).manifest for a in artifacts]  # refuses a mismatched manifest
    if out.exists() and not empty_folder(out):
        raise OutputError(f"{out} exists and is not an empty folder")
    names = [a.name for a in artifacts]
    if len(set(names)) != len(names):
        raise OutputError("two artifacts have the same file name")
    with atomic_directory(out, replaceable=empty_folder) as tmp:
        build(tmp, artifacts, manifests)
    return json.loads((out / "bundle.json").read_text())


def empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def build(root: Path, artifacts: list[Path], manifests: list[dict]) -> None:
    (root / "models").mkdir()
    for artifact in artifacts:
        shutil.copytree(artifact, root / "models" / artifact.name)
    for rel in RUNTIME_FILES:
        (root / "psa_edge" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PACKAGE / rel, root / "psa_edge" / rel)
    launcher = root / "psa-edge"
    launcher.write_text('#!/bin/sh\n# The psa-edge device runtime of this bundle.\n'
                        'cd "$(dirname "$0")" && exec python3 -m psa_edge.cli "$@"\n')
    launcher.chmod(0o755)
    has_pte = any(m.get("backend") == "executorch" for m in manifests)
    (root / "requirements-onnx.txt").write_text(pinned(ONNX_REQUIREMENTS))
    if has_pte:
        (root / "requirements-executorch.txt").write_text(
            pinned(ONNX_REQUIREMENTS + EXECUTORCH_REQUIREMENTS))
    (root / "README.md").write_text(readme(artifacts, manifests))
    files = sorted(p for p in root.rglob("*") if p.is_file())
    record = {"psa_edge": metadata_version(), "artifacts": [a.name for a in artifacts],
              "files": {str(p.relative_to(root)): sha256_file(p) for p in files}}
    (root / "bundle.json").write_text(json.dumps(record, indent=2) + "\n")


def metadata_version() -> str:
    from psa_edge import __version__

    return __version__


def readme(artifacts: list[Path], manifests: list[dict]) -> str:
    """The bundle's README from the templates beside this module: the Pi and Android commands
    on one of the bundle's artifacts, a .pte's requirements where there is one, ExecuTorch's
    LLM runner where a form it loads is bundled (`GraphForm.llm_runner`)."""
    onnx = next((a.name for a, m in zip(artifacts, manifests) if m.get("target") == "onnx"),
                None)
    runners = [a.name for a, m in zip(artifacts, manifests) if get_form(m["form"]).llm_runner]
    ptes = [a.name for a, m in zip(artifacts, manifests)  # the LLM runner's last
            if m.get("backend") == "executorch" and a.name not in runners] + runners
    listing = "\n".join(f"- `models/{a.name}`: {m.get('target')} {m.get('form')}, "
                        f"{(m.get('quantization') or {}).get('scheme', 'fp32')}, variant "
                        f"{m.get('variant')} (gamma_k {m.get('gamma_k')}, gamma_q "
                        f"{m.get('gamma_q')}), max length {m.get('max_seq_len')}"
                        for a, m in zip(artifacts, manifests))
    values = {"listing": listing, "example": onnx or ptes[0], "pte": ptes[0] if ptes else "",
              "runner": runners[0] if runners else ""}
    sections = ["bundle-readme.md"] + (["bundle-readme-pte.md"] if ptes else []) \
        + ["bundle-readme-android.md"] + (["bundle-readme-runner.md"] if runners else [])
    return "\n".join(Template((TEMPLATES / name).read_text()).substitute(values)
                     for name in sections)
