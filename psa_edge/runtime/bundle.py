"""`psa-edge bundle`: a self-contained folder to copy to a Raspberry Pi or an Android phone.

Contract: `write_bundle(artifacts, out)` checks every artifact against its manifest, then
writes into a temporary folder beside `out` and renames it into place (an existing non-empty
`out` is refused, a failure leaves nothing):
- `models/`: the artifact folders (model file, manifest, tokenizer);
- `psa_edge/`: the device runtime only (the CLI, `runtime/`, errors, io, tokenizer, display):
  numpy + onnxruntime + tokenizers (+ typer, rich for the CLI), ExecuTorch's runtime for a
  .pte; commands
  that need torch (train, export, ...) are not in it;
- `psa-edge`: a launcher (`python3 -m psa_edge.cli`);
- `requirements-onnx.txt` (aarch64 Linux: numpy, onnxruntime, tokenizers, typer, rich, pinned to the
  versions this bundle was tested with) and, when a .pte is bundled,
  `requirements-executorch.txt` (the executorch wheel and the torch it needs);
- `README.md`: the exact commands for a Raspberry Pi (64-bit OS) and for an Android phone
  (Termux + Python for the ONNX path; ExecuTorch's llama runner / benchmark app for a .pte);
- `bundle.json`: every file with its sha256.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

from psa_edge.errors import OutputError
from psa_edge.io import artifact_folder, atomic_directory, read_artifact, sha256_file

PACKAGE = Path(__file__).resolve().parent.parent
RUNTIME_FILES = ["__init__.py", "errors.py", "io.py", "contract.py", "tokenizer.py",
                 "display.py", "cli.py", "backends/__init__.py", "backends/base.py",
                 "backends/onnxruntime.py", "backends/executorch.py", "backends/huge_pages.py",
                 "runtime/__init__.py", "runtime/session.py", "runtime/generate.py",
                 "runtime/speculative.py", "runtime/run.py", "runtime/bench.py",
                 "runtime/bundle.py", "runtime/guard.py",
                 # verify against the reference logits recorded at export (reference.npz)
                 "checks/__init__.py", "checks/reference.py", "checks/verify.py"]
ONNX_REQUIREMENTS = ("numpy", "onnxruntime", "tokenizers", "typer", "rich")
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
    (root / "README.md").write_text(readme(artifacts, manifests, has_pte))
    files = sorted(p for p in root.rglob("*") if p.is_file())
    record = {"psa_edge": metadata_version(), "artifacts": [a.name for a in artifacts],
              "files": {str(p.relative_to(root)): sha256_file(p) for p in files}}
    (root / "bundle.json").write_text(json.dumps(record, indent=2) + "\n")


def metadata_version() -> str:
    from psa_edge import __version__

    return __version__


def readme(artifacts: list[Path], manifests: list[dict], has_pte: bool) -> str:
    onnx = next((a.name for a, m in zip(artifacts, manifests) if m.get("target") == "onnx"),
                None)
    pte = next((a.name for a, m in zip(artifacts, manifests) if m.get("backend") ==
                "executorch" and m.get("form") == "explicit-state"), None)
    runner = next((a for a, m in zip(artifacts, manifests) if m.get("form") == "runner"), None)
    listing = "\n".join(f"- `models/{a.name}`: {m.get('target')} {m.get('form')}, "
                        f"{(m.get('quantization') or {}).get('scheme', 'fp32')}, variant "
                        f"{m.get('variant')} (gamma_k {m.get('gamma_k')}, gamma_q "
                        f"{m.get('gamma_q')}), max length {m.get('max_seq_len')}"
                        for a, m in zip(artifacts, manifests))
    example = onnx or pte or (runner.name if runner else artifacts[0].name)
    text = f"""# psa-edge device bundle

{listing}

Everything here runs without PyTorch on the ONNX path: `psa_edge/` is the device runtime of
psa-edge (numpy, onnxruntime and tokenizers; typer and rich for the command line). Check the
copy with
`sha256sum` against `bundle.json`.

## Raspberry Pi (Raspberry Pi OS 64-bit, Python 3.11)

```sh
python3 -m venv ~/psa && . ~/psa/bin/activate
pip install -r requirements-onnx.txt          # aarch64 wheels from PyPI, nothing to compile
./psa-edge bench models/{example} -p 128 -n 128 -r 5
./psa-edge generate models/{example} --prompt "ABCDEFGHABCD" -n 16 --prompt-lookup
./psa-edge verify models/{example}            # against the logits recorded at export
```

Installed, the venv takes about 230 MB on aarch64 (tokenizers brings huggingface_hub and
httpx along); psa-edge's CI installs it and runs these commands under emulation
(docs/device.md of psa-edge).
"""
    if has_pte:
        text += f"""
A .pte (`models/{pte or (runner.name if runner else '')}`) needs ExecuTorch's Python runtime,
whose wheel needs torch: `requirements-executorch.txt` installs both on x86-64 Linux or macOS.
Not on a Pi: PyPI's aarch64 torch wheel is a CUDA build that does not import without CUDA's
libraries. On a Pi or a phone a runner-form .pte runs in ExecuTorch's C++ LLM runner (below).
"""
    text += f"""
With `--vs models/<twin>` the gamma = 0 twin runs interleaved and the PSA/twin time ratio is
reported; `--json` for machines, `--plot bench.png` for a picture.

## Android phone

ONNX path, in Termux (F-Droid build; its Python is 3.13): numpy and onnxruntime come from
Termux's own packages (PyPI has no Android wheels). Its `python-onnxruntime` broke at import
after the move to Python 3.13 and was fixed the next day (termux-packages#28769, #28775): run
`pkg upgrade` first. Not tested by psa-edge (no Android device in its CI).

```sh
pkg upgrade && pkg install python python-numpy python-onnxruntime tur-repo
pkg install python-tokenizers                 # from the Termux User Repository
pip install typer rich
cp -r /sdcard/Download/<this folder> ~/bundle && cd ~/bundle
./psa-edge bench models/{example} -p 128 -n 128 -r 5
```
"""
    if runner is not None:
        text += f"""
ExecuTorch path: the runner-form program `models/{runner.name}/model.pte` and its
`tokenizer.json` are what ExecuTorch's own LLM runner loads. Build `llama_main` for Android
(arm64-v8a) with the NDK as ExecuTorch's LLM documentation describes (`examples/models/llama`),
with its LLM kernels (`-DEXECUTORCH_BUILD_KERNELS_LLM=ON`, as its LLM preset sets; the program's
caches are written and read by `llama::update_cache` and `llama::custom_sdpa`), push it with
`adb` and run it there; its report prints prompt-eval and generation tokens/s:

```sh
adb push models/{runner.name} /data/local/tmp/psa/
adb shell "cd /data/local/tmp/psa/{runner.name} && ./llama_main --model_path model.pte \\
    --tokenizer_path tokenizer.json --prompt ABCDABC --seq_len 64 --temperature 0"
```

Or load it in ExecuTorch's Android benchmark app (`extension/benchmark/android`), which reports
the same figures. The same runner builds for aarch64 Linux (a Pi) with cmake. Not tested by
psa-edge on a device: its CI runs this program through ExecuTorch's `TextLLMRunner` on x86.
"""
    return text
