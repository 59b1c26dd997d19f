"""Hugging Face interop against transformers itself: a random LlamaForCausalLM that transformers
saves, imported, exported to ONNX and XNNPACK and back to the save_pretrained layout (with the
PSA modeling code), and the twin's ONNX folder run by optimum and onnxruntime-genai as written."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import cli
from psa_edge.checks.reference import Reference
from psa_edge.runtime.session import open_session

TOKENS = np.random.default_rng(0).integers(0, 384, size=24)


def hf_logits(folder, tokens, remote=False):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=remote,
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens)[None]).logits[0].numpy()


@pytest.mark.parametrize("name", ["onnx", "xnnpack"])
def test_an_imported_llama_exports_to_transformers_logits(hf_llama, imported, name):
    expected = hf_logits(hf_llama, TOKENS)
    tol = 1e-4 * max(1.0, float(np.abs(expected).max()))
    session = open_session(imported[name])
    assert np.abs(session.feed(TOKENS) - expected).max() <= tol
    session.reset()
    stepped = np.concatenate([session.feed([t]) for t in TOKENS])
    assert np.abs(stepped - expected).max() <= tol
    from transformers import PreTrainedTokenizerFast

    theirs = PreTrainedTokenizerFast.from_pretrained(str(hf_llama))
    assert session.tokenizer.encode("import os\n") == theirs.encode("import os\n")


def test_export_hf_loads_in_transformers_with_psa_logits_and_round_trips(imported, tmp_path):
    from psa_edge.model.checkpoint import read_checkpoint

    folder = tmp_path / "psa-hf"
    assert cli("export-hf", imported["psa"], "-o", folder).returncode == 0
    assert (folder / "modeling_psa.py").exists()
    reference = Reference.of_checkpoint(imported["psa"])
    expected = reference.logits(TOKENS)
    tol = 1e-4 * max(1.0, float(np.abs(expected).max()))
    assert np.abs(hf_logits(folder, TOKENS, remote=True) - expected).max() <= tol
    # and generation through transformers' own KV cache continues the shear correctly
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()
    with torch.no_grad():
        hf_tokens = model.generate(torch.as_tensor(TOKENS[:8])[None], max_new_tokens=12,
                                   do_sample=False)[0, 8:].tolist()
    ours = json.loads(cli("generate", imported["psa-onnx"], "--prompt-ids",
                          ",".join(map(str, TOKENS[:8])), "-n", "12", "--json").stdout)
    assert hf_tokens[:len(ours["tokens"])] == ours["tokens"]
    back = tmp_path / "back.pt"
    assert cli("import-hf", folder, "-o", back).returncode == 0  # its own shear, by default
    a, b = read_checkpoint(imported["psa"]), read_checkpoint(back)
    assert a["config"] == b["config"] and a["tokenizer"] == b["tokenizer"]
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def test_a_gamma_zero_model_is_a_plain_llama(imported, tmp_path):
    folder = tmp_path / "twin-hf"
    assert cli("export-hf", imported["twin"], "-o", folder).returncode == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in config
    assert not (folder / "modeling_psa.py").exists()
    expected = Reference.of_checkpoint(imported["twin"]).logits(TOKENS)
    assert np.abs(hf_logits(folder, TOKENS) - expected).max() <= 1e-4 * np.abs(expected).max()


def run_client(code: str, folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                          text=True, timeout=300)


def test_optimum_and_onnxruntime_genai_run_the_twin_folder_as_written(imported):
    prompt = [int(t) for t in TOKENS[:6]]
    ours = json.loads(cli("generate", imported["onnx"], "--prompt-ids",
                          ",".join(map(str, prompt)), "-n", "10", "--json").stdout)["tokens"]
    optimum = run_client(f"""
import sys, json, torch
from optimum.onnxruntime import ORTModelForCausalLM
model = ORTModelForCausalLM.from_pretrained(sys.argv[1], use_cache=True, use_io_binding=False)
out = model.generate(torch.tensor([{prompt}]), max_new_tokens=10, do_sample=False)
print(json.dumps(out[0, {len(prompt)}:].tolist()))
""", imported["onnx"])
    assert optimum.returncode == 0, optimum.stderr[-3000:]
    genai = run_client(f"""
import sys, json
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
params = og.GeneratorParams(model)
params.set_search_options(max_length={len(prompt) + 10}, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens({prompt})
out = []
while not generator.is_done():
    generator.generate_next_token()
    out.append(int(generator.get_next_tokens()[0]))
print(json.dumps(out))
""", imported["onnx"])
    assert genai.returncode == 0, genai.stderr[-3000:]
    for client in (optimum, genai):
        tokens = json.loads(client.stdout.strip().splitlines()[-1])
        assert tokens == ours


def test_import_hf_reads_the_shards_transformers_writes(hf_llama, imported, tmp_path):
    from transformers import AutoModelForCausalLM

    from psa_edge.model.checkpoint import read_checkpoint

    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(str(hf_llama), dtype=torch.float32)
    model.save_pretrained(str(sharded), max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((hf_llama / name).read_bytes())
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists(), shards
    assert cli("import-hf", sharded, "-o", tmp_path / "m.pt").returncode == 0
    ours = read_checkpoint(tmp_path / "m.pt")["state_dict"]
    whole = read_checkpoint(imported["twin"])["state_dict"]
    assert ours.keys() == whole.keys()
    assert all(torch.equal(ours[k], whole[k]) for k in whole)


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "config.json").unlink(), "no config.json"),
    (lambda d: (d / "config.json").write_text(json.dumps({
        **json.loads((d / "config.json").read_text()), "model_type": "mistral",
        "architectures": ["MistralForCausalLM"]})), "is not a LlamaForCausalLM"),
    (lambda d: (d / "config.json").write_text(json.dumps({
        **json.loads((d / "config.json").read_text()), "attention_bias": True})),
     "attention_bias"),
    (lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:1000]), "not a readable safetensors"),
    (lambda d: (d / "tokenizer.json").write_text("{not json"), "not a Hugging Face"),
    *[(lambda d, key=key, value=value: (d / "config.json").write_text(json.dumps({
        **json.loads((d / "config.json").read_text()), key: value})), f"{key} = ")
      for key, value in (("model_type", []), ("rope_scaling", 1.5), ("hidden_size", "64"),
                         ("gamma_k", "x"), ("num_attention_heads", True))],
    (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"metadata": {}}'),
     "has no weight_map"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model-00002.safetensors"}})),
     "has no model-00002.safetensors"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "../llama/model.safetensors"}})),
     "names a shard outside its folder"),
])
def test_import_hf_bad_input(hf_llama, tmp_path, damage, message):
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(hf_llama, folder)
    damage(folder)
    out = tmp_path / "out"
    out.mkdir()
    result = cli("import-hf", folder, "-o", out / "m.pt")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(out) == []
