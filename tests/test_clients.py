"""The stock clients on the shipped PSA models' export folders as psa-edge writes them: optimum's
ORTModelForCausalLM and onnxruntime-genai on the raw-key ONNX form, ExecuTorch's TextLLMRunner
on the runner-form .pte, transformers with trust_remote_code on the export-hf folder. Each
generates 32 greedy tokens, and the whole sequence must be psa-edge's own, on the default model
(no end-of-text token) and on the code model (one). Each client runs in its own process, as a
user's script would, over both models at once."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from exported import SHIPPED

NEW_TOKENS = 32
PROMPTS = {"default": [5, 6, 7, 8, 9, 10, 5, 6], "code": "def fib(n):\n"}

CLIENTS = {
    "optimum": ("raw-key", """
import torch
from optimum.onnxruntime import ORTModelForCausalLM
def run(folder, ids, n):
    model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True, use_io_binding=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()
"""),
    "onnxruntime-genai": ("raw-key", """
import onnxruntime_genai as og
def run(folder, ids, n):
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out
"""),
    "transformers": ("hf", """
import torch
from transformers import AutoModelForCausalLM
def run(folder, ids, n):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()
"""),
}
# TextLLMRunner takes text and calls back with each new token's text; the README's lines.
RUNNER = """
from executorch.extension.llm.custom_ops import custom_ops  # the runner form's llama kernels
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
def run(folder, text, n):
    runner = TextLLMRunner(folder + "/model.pte", folder + "/tokenizer.json")
    pieces = []
    runner.generate(text, GenerationConfig(echo=False, max_new_tokens=n, temperature=0.0),
                    token_callback=pieces.append)
    return pieces
"""
MAIN = """
import json, sys
print(json.dumps([run(folder, prompt, n) for folder, prompt, n in json.loads(sys.argv[1])]))
"""


def run_client(code: str, jobs: list) -> list:
    result = subprocess.run([sys.executable, "-c", code + MAIN, json.dumps(jobs)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def ours(folder, prompt_ids: list) -> list:
    """psa-edge generate's greedy tokens on the folder (the checkpoint for an export-hf one)."""
    from psa_edge.runtime.generate import generate
    from psa_edge.runtime.session import open_session

    return generate(open_session(folder), prompt_ids, NEW_TOKENS).tokens


def prompt_ids(name: str) -> list:
    from psa_edge.model.checkpoint import load_checkpoint, tokenizer_of

    prompt = PROMPTS[name]
    if isinstance(prompt, list):
        return prompt
    return tokenizer_of(load_checkpoint(SHIPPED[name])[0]).encode(prompt)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_generates_what_psa_edge_generates(shipped, client):
    kind, code = CLIENTS[client]
    prompts = {name: prompt_ids(name) for name in SHIPPED}
    expected = {name: ours(shipped[f"{name}-raw-key"], prompts[name]) for name in SHIPPED}
    assert all(len(tokens) == NEW_TOKENS for tokens in expected.values()), expected
    folders = {name: str(shipped[f"{name}-{kind}"]) for name in SHIPPED}
    got = run_client(code, [(folders[name], prompts[name], NEW_TOKENS) for name in SHIPPED])
    assert dict(zip(SHIPPED, got)) == expected


def test_text_llm_runner_generates_what_psa_edge_generates(shipped):
    from psa_edge.model.checkpoint import load_checkpoint, tokenizer_of

    jobs, expected = [], []
    for name, path in SHIPPED.items():
        tokenizer = tokenizer_of(load_checkpoint(path)[0])
        ids = prompt_ids(name)
        tokens = ours(shipped[f"{name}-runner"], ids)
        jobs.append((str(shipped[f"{name}-runner"]), tokenizer.decode(ids), NEW_TOKENS))
        expected.append((tokenizer.decode(tokens), NEW_TOKENS))
    got = run_client(RUNNER, jobs)
    assert [("".join(pieces), len(pieces)) for pieces in got] == expected


def test_readme_shows_each_client_with_what_it_needs():
    """The README's client lines are the ones these tests run: the TextLLMRunner import it
    needs, and the form each client takes."""
    readme = (REPO / "README.md").read_text()
    assert RUNNER.split("\n")[1] in readme
    for needed in ("--form raw-key", "--form runner", "export-hf", "trust_remote_code=True",
                   "ORTModelForCausalLM", "og.Model"):
        assert needed in readme, needed


def test_export_hf_keeps_the_checkpoints_weight_dtype(shipped):
    """The code model is stored in float16: its export-hf weights are the same float16 values
    (not float32, twice the size), and the config says so."""
    from safetensors import safe_open

    from psa_edge.model.checkpoint import read_checkpoint

    stored = read_checkpoint(SHIPPED["code"])["state_dict"]
    folder = shipped["code-hf"]
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        assert names and all(weights.get_tensor(n).dtype == torch.float16 for n in names)
        assert all(torch.equal(weights.get_tensor(n), stored[n]) for n in names)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "float16"
    size = (folder / "model.safetensors").stat().st_size
    assert size < 1.05 * sum(t.numel() * 2 for n, t in stored.items() if n in names)
