"""The output rule for folders (#56's data-loss cases): `export -o` and `export-hf -o` replace
a folder only when psa-edge can prove it wrote it, of that kind: its manifest is psa-edge's and
lists exactly the files the folder holds. A user's folder that happens to hold a manifest.json,
an artifact with a file added, and the other command's folder are refused in one line (exit
2), left as they were."""

import hashlib
import json

import pytest

from conftest import REPO, cli, copy_artifact
from psa_edge.io import ARTIFACT_FOLDER, HF_EXPORT_FOLDER

DEFAULT = REPO / "models" / "psa-default.pt"


def snapshot(folder):
    """Every path under the folder and its bytes' digest (None for a folder)."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                         if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "default-hf"
    assert cli("export-hf", DEFAULT, "-o", folder).returncode == 0
    return folder


def user_folder(root):
    """A folder a user keeps, which holds a manifest.json among other things."""
    folder = root / "extension"
    (folder / "icons").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"manifest_version": 3, "name": "x"}))
    (folder / "background.js").write_text("console.log(1)\n")
    (folder / "icons" / "a.png").write_bytes(b"\x89PNG")
    return folder


@pytest.mark.parametrize("command", ["export", "export-hf"])
def test_a_users_folder_holding_a_manifest_is_never_replaced(tmp_path, command):
    folder = user_folder(tmp_path)
    before = snapshot(folder)
    extra = ["--target", "onnx"] if command == "export" else []
    result = cli(command, DEFAULT, *extra, "-o", folder)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "psa-edge wrote" in result.stderr and "choose another output" in result.stderr
    assert snapshot(folder) == before


def test_each_command_replaces_only_its_own_kind_of_folder(artifacts, hf_folder, tmp_path):
    onnx = copy_artifact(artifacts["onnx"], tmp_path / "onnx")
    hf = copy_artifact(hf_folder, tmp_path / "hf")
    assert ARTIFACT_FOLDER(onnx) and not ARTIFACT_FOLDER(hf)
    assert HF_EXPORT_FOLDER(hf) and not HF_EXPORT_FOLDER(onnx)
    for command, folder, extra in (("export-hf", onnx, []), ("export", hf, ["--target", "onnx"])):
        before = snapshot(folder)
        result = cli(command, DEFAULT, *extra, "-o", folder)
        assert result.returncode == 2 and "choose another output" in result.stderr, command
        assert snapshot(folder) == before
    # A file added to an artifact folder makes it a folder psa-edge cannot prove it wrote.
    (onnx / "notes.txt").write_text("mine")
    assert not ARTIFACT_FOLDER(onnx)
    (onnx / "notes.txt").unlink()
    (onnx / "sub").mkdir()
    assert not ARTIFACT_FOLDER(onnx)


def test_export_hf_replaces_its_own_folder(hf_folder, tmp_path):
    folder = copy_artifact(hf_folder, tmp_path / "again")
    result = cli("export-hf", DEFAULT, "-o", folder)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) | {"manifest.json"} == {p.name for p in folder.iterdir()}
