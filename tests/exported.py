"""The session's exported artifacts, as fixtures (a pytest plugin that conftest loads).

Exporting is most of the suite's work and the tests that read the artifacts run one at a time,
so the exports start together when the session starts (`start_exports`), two at a time in
worker processes at the lowest CPU priority (`export_worker`), and the tests that need none of
them run first (`pytest_collection_modifyitems`) while the workers export. Each export fixture
returns an `Exports` mapping whose entries wait for their own export when read. Only the
fixtures that the selected tests use are started, so a run of a few tests does not pay for the
rest."""

import email
import json
import multiprocessing
import os
import shutil
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

from conftest import CASES, MAX_LEN, REPO, cli, make_model
from psa_edge.export.quantize import QuantSpec

DEFAULT = REPO / "models" / "psa-default.pt"
TINY_LEN = 48
STATIC, DYNAMIC, INT4 = QuantSpec("int8"), QuantSpec("int8-dynamic"), QuantSpec("int4")
INT4_G128 = QuantSpec("int4", group_size=128)
# In the order they are submitted to the pool; their readers run in this order (the sort below).
EXPORT_FIXTURES = ("artifacts", "imported", "default_int8", "int8", "text_model", "shipped")
SHIPPED = {"default": DEFAULT, "code": REPO / "models" / "psa-code.pt"}


class Exports(Mapping):
    """name -> artifact folder (or another path); reading an exported name waits for it."""

    def __init__(self, paths: dict, futures: dict[str, Future]):
        self._paths, self._futures = paths, futures

    def __getitem__(self, name):
        if name in self._futures:
            self._futures[name].result()
        return self._paths[name]

    def __iter__(self):
        return iter(self._paths)

    def __len__(self):
        return len(self._paths)

    def add(self, name: str, path: Path, future: Future) -> None:
        self._paths[name], self._futures[name] = path, future


def export_all(pool, requests: dict, **ready) -> Exports:
    """Submit `run_export` for every request to the pool; `ready` names paths that exist."""
    from psa_edge.export.pipeline import run_export

    # Longest first (two-method XNNPACK programs, then other ExecuTorch ones, then ONNX), so
    # the two workers finish together.
    cost = lambda item: (item[1].target != "xnnpack" or item[1].form == "runner",  # noqa: E731
                         item[1].target == "onnx")
    futures = {name: pool.submit(run_export, request)
               for name, request in sorted(requests.items(), key=cost)}
    return Exports({**ready, **{name: r.output for name, r in requests.items()}}, futures)


def export_damaged(request):
    """`run_export` with the first layer's key weights perturbed after the transform stage, so
    that the build's manifest still names the checkpoint (run in a pool worker)."""
    import torch

    from psa_edge.export import pipeline

    transform = pipeline.transform

    def damaging_transform(model, req):
        model = transform(model, req)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            weight = model.model.layers[0].self_attn.k_proj.weight
            weight.add_(0.6 * weight.std() * torch.randn(weight.shape, generator=generator))
        return model

    pipeline.transform = damaging_transform
    try:
        return pipeline.run_export(request)
    finally:
        pipeline.transform = transform


def pytest_collection_modifyitems(items):
    """Tests that read no export first, then the readers of each export fixture in the order
    the fixtures are submitted (`EXPORT_FIXTURES`), so that a test waits for the exports
    finished first (a stable sort: each group keeps its order). Sorted by file instead, the
    first reader of the last-submitted exports waited 79 s while later-submitted work ran."""
    def last_export(item) -> int:
        used = [i for i, name in enumerate(EXPORT_FIXTURES) if name in item.fixturenames]
        return max(used, default=-1)

    items.sort(key=last_export)


@pytest.fixture(scope="session", autouse=True)
def start_exports(request):
    """Start the exports that the selected tests read, before the first test runs."""
    wanted = set().union(*(item.fixturenames for item in request.session.items))
    for name in EXPORT_FIXTURES:
        if name in wanted:
            try:
                request.getfixturevalue(name)
            except (Exception, pytest.fail.Exception, pytest.skip.Exception):
                pass  # pytest keeps the error and raises it in each test that reads the fixture


def export_worker() -> None:
    """A pool worker: one torch thread, at the lowest CPU priority. The test process runs the
    tests one after another and is the suite's critical path: at equal priority it shared two
    cores with both workers while they exported, and then ran the tests that read the exports
    on one core while the other idled for half the suite."""
    import torch

    os.nice(19)
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def export_pool():
    # spawn: a forked child of a process whose OpenMP pool is running can deadlock.
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                               initializer=export_worker)
    try:
        yield pool
    finally:  # a session stopped early (-x, Ctrl-C) does not wait for exports nobody reads
        pool.shutdown(cancel_futures=True)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    from psa_edge.model.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for variant in ("symmetric", "key-only"):
        # GQA (4 query heads over 2 KV heads) and 2 layers, so the I/O carries both.
        model = make_model(variant, num_attention_heads=4, num_key_value_heads=2,
                           num_hidden_layers=2)
        out[variant] = root / f"{variant}.pt"
        save_checkpoint(out[variant], model, {"task": {"name": "ih-sht", "params": {
            "seq_len": 64, "alphabet": 64}}})
    return out


@pytest.fixture(scope="session")
def artifacts(checkpoints, tmp_path_factory, export_pool):
    """Tiny models of each variant in every target and form (`CASES`): name -> folder."""
    from psa_edge.export.pipeline import ExportRequest

    root = tmp_path_factory.mktemp("artifacts")
    return export_all(export_pool, {
        name: ExportRequest(checkpoints[variant], target, root / name, MAX_LEN, twin, form)
        for name, (variant, target, twin, form) in CASES.items()})


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from psa_edge.model.checkpoint import save_checkpoint

    path = tmp_path_factory.mktemp("qckpt") / "tiny.pt"
    model = make_model("key-only", num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=2)
    save_checkpoint(path, model, {"task": {"name": "ih-sht", "params": {"seq_len": 64,
                                                                          "alphabet": 64}}})
    return path


@pytest.fixture(scope="session")
def int8(tiny_checkpoint, tmp_path_factory, export_pool):
    """Tiny-model int8 artifacts: name -> folder."""
    from psa_edge.export.pipeline import ExportRequest

    root = tmp_path_factory.mktemp("int8")
    cases = {"onnx": ("onnx", STATIC, False), "onnx-seed1": ("onnx", QuantSpec("int8", seed=1),
                                                             False),
             "onnx-shear": ("onnx", QuantSpec("int8", keep_shear_fp32=False), False),
             "onnx-twin": ("onnx", STATIC, True), "xnnpack-dynamic": ("xnnpack", DYNAMIC, False),
             "xnnpack-shear": ("xnnpack", QuantSpec("int8", keep_shear_fp32=False), False)}
    requests = {name: ExportRequest(tiny_checkpoint, target, root / name, TINY_LEN, twin,
                                    quant=spec) for name, (target, spec, twin) in cases.items()}
    requests["runner-dynamic"] = ExportRequest(tiny_checkpoint, "xnnpack", root / "runner",
                                               TINY_LEN, False, "runner", quant=DYNAMIC)
    return export_all(export_pool, requests)


@pytest.fixture(scope="session")
def default_int8(tmp_path_factory, export_pool):
    """The default model's quantized builds, and an ONNX int8 build whose weights were
    perturbed before export while its manifest still names the default model ("damaged")."""
    from psa_edge.export.pipeline import ExportRequest

    root = tmp_path_factory.mktemp("default-int8")
    exports = export_all(export_pool, {
        name: ExportRequest(DEFAULT, target, root / f"default-{name}", form=form, quant=spec)
        for name, target, spec, form in (
            ("onnx", "onnx", STATIC, "explicit-state"),
            ("xnnpack", "xnnpack", STATIC, "explicit-state"),
            ("int4", "onnx", INT4, "explicit-state"),
            ("xnnpack-int4", "xnnpack", INT4, "explicit-state"),
            ("int8-block", "onnx", QuantSpec("int8-block"), "explicit-state"),
            ("fused-int4", "onnx", INT4, "fused"),
            ("int4-g128", "onnx", INT4_G128, "explicit-state"),
            ("xnnpack-int4-g128", "xnnpack", INT4_G128, "explicit-state"))})
    damaged = ExportRequest(DEFAULT, "onnx", root / "damaged-onnx-int8", quant=STATIC)
    exports.add("damaged", damaged.output, export_pool.submit(export_damaged, damaged))
    return exports


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory):
    """A small random LlamaForCausalLM (GQA, 2 layers) saved by transformers, weights scaled up
    so that errors show, with a byte-level BPE tokenizer saved by PreTrainedTokenizerFast."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from psa_edge.tokenizer import train_bpe

    folder = tmp_path_factory.mktemp("hf") / "llama"
    tokenizer = train_bpe(["def f(x):\n    return x * 2\n" * 50, "import os\nprint(os.sep)\n"
                           * 50], 384)
    config = LlamaConfig(vocab_size=384, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, eos_token_id=tokenizer.eos_id,
                         bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.save_pretrained(str(folder))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer.hf, eos_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def imported(hf_llama, tmp_path_factory, export_pool):
    """The random Llama imported as its twin and as a key-only PSA model, and their exports."""
    from psa_edge.export.pipeline import ExportRequest

    root = tmp_path_factory.mktemp("imported")
    for name, args in (("twin", []), ("psa", ["--variant", "key-only"])):
        result = cli("import-hf", hf_llama, "-o", root / f"{name}.pt", *args)
        assert result.returncode == 0, result.stderr
    return export_all(export_pool, {
        "onnx": ExportRequest(root / "twin.pt", "onnx", root / "twin-onnx"),
        "xnnpack": ExportRequest(root / "twin.pt", "xnnpack", root / "twin-xnnpack"),
        "psa-onnx": ExportRequest(root / "psa.pt", "onnx", root / "psa-onnx")},
        twin=root / "twin.pt", psa=root / "psa.pt")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Real text: a copy of the standard library's `email` and `json` packages."""
    root = tmp_path_factory.mktemp("corpus")
    for package in (email, json):
        shutil.copytree(Path(package.__file__).parent, root / package.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="session")
def text_model(corpus, tmp_path_factory, export_pool):
    """A tiny key-only language model trained a few steps on the corpus, and its ONNX and
    runner-form exports."""
    from psa_edge.export.pipeline import ExportRequest

    root = tmp_path_factory.mktemp("text")
    out = root / "code.pt"
    result = cli("train", "--text", corpus, "--preset", "tiny", "--vocab-size", "384",
                 "--seq-len", "64", "--steps", "40", "--batch-size", "16", "--eval-every",
                 "20", "--eval-samples", "16", "--device", "cpu", "-o", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return export_all(export_pool, {
        "onnx": ExportRequest(out, "onnx", root / "onnx"),
        "runner": ExportRequest(out, "portable", root / "runner", form="runner")},
        checkpoint=out)


def client_commands() -> list[list[str]]:
    """The README's commands that write the folders stock clients take (its "In other
    clients" section), as argument lists after the program name."""
    import re
    import shlex

    section = (REPO / "README.md").read_text().split("## In other clients")[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.strip()]


def run_cli(argv: list[str]) -> None:
    """One psa-edge command through the CLI's own app (in a pool worker)."""
    from typer.testing import CliRunner

    from psa_edge.cli import app

    result = CliRunner().invoke(app, argv)
    if result.exit_code:
        raise RuntimeError(f"psa-edge {' '.join(argv)}: {result.output[-800:]}")


@pytest.fixture(scope="session")
def shipped(tmp_path_factory, export_pool):
    """The README's client commands (written for the code model) run on both shipped PSA
    models, the default one without an end-of-text token and the code model with one:
    "{model}-raw-key" (ONNX, raw-key form), "{model}-runner" (runner-form .pte) and
    "{model}-hf" (export-hf)."""
    root = tmp_path_factory.mktemp("shipped")
    commands = client_commands()
    assert len(commands) == 3
    exports = Exports({}, {})
    for name, path in SHIPPED.items():
        for argv in sorted(commands, key=lambda a: "xnnpack" not in a):  # the longest first
            argv = [str(path) if a == "models/psa-code.pt" else a for a in argv]
            out = argv.index("-o") + 1
            kind = Path(argv[out]).name.removeprefix("code-")
            argv[out] = str(root / f"{name}-{kind}")
            exports.add(f"{name}-{kind}", Path(argv[out]), export_pool.submit(run_cli, argv))
    return exports
