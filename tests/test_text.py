"""Language models on text: training on a corpus, the tokenizer that travels with every artifact
(read back by Hugging Face `tokenizers` and `PreTrainedTokenizerFast`; by ExecuTorch's
`TextLLMRunner` in tests/test_clients.py), the metrics against hand computations, text
generation, and bad input."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cli, make_model
from psa_edge.tasks.text import copy_positions

SNIPPET = "def parse(self, text):\n    return json.loads(text)  # ünïcode ✓\n"


def test_the_checkpoint_records_its_corpus_and_carries_its_tokenizer(text_model, corpus):
    from psa_edge.model.checkpoint import load_checkpoint, read_checkpoint

    manifest = json.loads(Path(f"{text_model['checkpoint']}.json").read_text())
    record = manifest["metadata"]["task"]["params"]["corpus"]
    assert record["root"] == str(corpus) and "json/decoder.py" in record["files"]
    assert len(record["sha256"]) == 64 and record["documents"] == len(record["files"])
    assert isinstance(read_checkpoint(text_model["checkpoint"])["tokenizer"], str)
    model, _ = load_checkpoint(text_model["checkpoint"])
    assert model.tokenizer.vocab_size == model.cfg.vocab_size == 384
    assert model.cfg.eos_token_id == model.tokenizer.eos_id is not None
    final = manifest["metadata"]["summary"]["final"]
    assert final["val_perplexity"] > 1 and 0 <= final["copy_accuracy"] <= 1


def test_quant_check_scores_a_language_model_by_perplexity(text_model):
    """A float artifact against its own checkpoint: the text path of quant-check (copy
    positions come from the inputs) agrees with itself, perplexity ratio 1."""
    result = cli("quant-check", text_model["checkpoint"], text_model["onnx"], "--samples", "4",
                 "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(result.stdout)["metrics"]
    assert abs(metrics["target_perplexity_ratio"] - 1) < 1e-3
    assert metrics["accuracy_delta_points"] == 0 and metrics["top1_agreement"] > 0.99


@pytest.mark.parametrize("folder", ["onnx", "runner"])
def test_every_export_writes_a_tokenizer_that_hugging_face_reads_the_same_way(text_model,
                                                                              folder):
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast

    from psa_edge.runtime.session import open_session

    path = text_model[folder]
    ours = open_session(path).tokenizer
    ids = ours.encode(SNIPPET)
    assert ours.decode(ids) == SNIPPET
    hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
    assert hf.encode(SNIPPET, add_special_tokens=False).ids == ids
    assert hf.decode(ids, skip_special_tokens=False) == SNIPPET
    fast = PreTrainedTokenizerFast.from_pretrained(str(path))
    assert fast.encode(SNIPPET) == ids and fast.decode(ids) == SNIPPET
    assert fast.eos_token == "<|endoftext|>" and fast.eos_token_id == ours.eos_id


def test_a_task_models_character_tokenizer_decodes_everywhere(artifacts):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast.from_pretrained(str(artifacts["onnx"]))
    assert fast.decode(fast.encode("ABCab09+/")) == "ABCab09+/"


def test_copy_positions_and_perplexity_by_hand():
    inputs = np.array([[5, 6, 7, 5, 6, 8, 5, 6, 7]])
    # bigrams ending at t: (5,6)@1 (6,7)@2 (7,5)@3 (5,6)@4* (6,8)@5 (8,5)@6 (5,6)@7* (6,7)@8*
    assert copy_positions(inputs).tolist() == [[0, 0, 0, 0, 1, 0, 0, 1, 1]]
    assert copy_positions(inputs, 1).tolist() == [[0, 0, 0, 1, 1, 0, 1, 1, 1]]

    from psa_edge.train.trainer import evaluate

    class Fixed:  # a task of 3 fixed sequences
        name, vocab_size, seq_len, chance = "fixed", 64, 9, 1 / 64

        def sample(self, split, n, seed):
            x = np.random.default_rng(0).integers(0, 64, size=(3, 10))
            return x[:, :-1], x[:, 1:]

        def score(self, predictions, targets, inputs):
            return {"accuracy": float((predictions == targets).mean())}

    model = make_model("key-only")
    got = evaluate(model, Fixed(), 3)
    x, y = Fixed().sample("test", 3, 0)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).double().numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert got["val_loss"] == pytest.approx(nll, rel=1e-5)
    assert got["val_perplexity"] == pytest.approx(np.exp(nll), rel=1e-5)
    assert got["accuracy"] == pytest.approx((logits.argmax(-1) == y).mean())


def test_generate_streams_text_and_stops_at_a_stop_string(text_model):
    plain = cli("generate", text_model["onnx"], "--prompt", "import ", "-n", "12", "--json")
    assert plain.returncode == 0, plain.stderr
    report = json.loads(plain.stdout)
    from psa_edge.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(text_model["onnx"] / "tokenizer.json")
    assert report["text"] == tokenizer.decode(report["tokens"])
    stop = report["text"][-2:]  # a string the greedy continuation is known to produce
    stopped = cli("generate", text_model["onnx"], "--prompt", "import ", "-n", "12", "--stop",
                  stop, "--stream")
    before = report["text"][:report["text"].index(stop)]
    assert stopped.returncode == 0 and stopped.stdout == before + "\n", stopped.stdout
    assert "stop_string" in stopped.stderr


@pytest.mark.parametrize("make,message", [
    (lambda d: (d / "empty.py").write_text(""), "empty"),
    (lambda d: (d / "blob.bin").write_bytes(bytes(range(256)) * 4), "not a UTF-8 text file"),
    (lambda d: (d / "sub").mkdir() or (d / "sub" / "x.bin").write_bytes(b"\x00\x01"),
     "holds no text"),
    (lambda d: (d / "ok.py").write_text("x = 1\n" * 200), "below the byte alphabet"),
    (lambda d: (d / "one.py").write_text("x = 1\n" * 200), "fewer than one sequence"),
])
def test_text_bad_input(tmp_path, make, message):
    source = tmp_path / "in"
    source.mkdir()
    make(source)
    target = [source / n for n in os.listdir(source)][0]
    out = tmp_path / "out"
    out.mkdir()
    extra = ["--vocab-size", "100"] if message.startswith("below") else []
    result = cli("train", "--text", target, "--steps", "2", "--device", "cpu", *extra,
                 "-o", out / "m.pt")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(out) == []


def test_a_split_is_tokenized_on_its_first_use_only(text_model, monkeypatch):
    """eval and quant-check read the validation split alone: they tokenize a twentieth of the
    corpus, not all of it."""
    from psa_edge.model.checkpoint import load_checkpoint
    from psa_edge.tasks import task_from_dict
    from psa_edge.tasks.text import TextTask

    model, metadata = load_checkpoint(text_model["checkpoint"])
    tokenized, stream = [], TextTask.stream

    def counted(task, documents):
        tokenized.append(documents)
        return stream(task, documents)

    monkeypatch.setattr(TextTask, "stream", counted)
    task = task_from_dict(metadata["task"], model.tokenizer)
    assert tokenized == []
    task.sample("test", 2, seed=0)
    task.sample("test", 2, seed=1)
    assert tokenized == [task.corpus.split("test")] and len(tokenized[0]) > 0
    assert len(task.corpus.split("train")) > len(tokenized[0])


def test_a_text_run_tokenizes_both_splits_before_its_first_step(corpus):
    """The stages the train command's bar names, in order; both splits are checked up front."""
    from psa_edge.train.run import TEXT_STAGES, text_task
    from psa_edge.train.trainer import TrainSpec

    stages = []
    spec = TrainSpec(task="text", text=(str(corpus),), vocab_size=384,
                     task_params={"seq_len": 64})
    task = text_task(spec, None, stages.append)
    assert stages == list(TEXT_STAGES) and sorted(task.streams) == ["test", "train"]


def test_a_changed_corpus_is_noticed(text_model, corpus, tmp_path):
    moved = tmp_path / "corpus"
    shutil.copytree(corpus, moved)
    manifest = json.loads(Path(f"{text_model['checkpoint']}.json").read_text())
    record = dict(manifest["metadata"]["task"]["params"]["corpus"], root=str(moved))
    from psa_edge.errors import CorpusError
    from psa_edge.tasks.text import corpus_from_record

    assert corpus_from_record(record).sha256 == record["sha256"]
    with open(moved / "json" / "decoder.py", "a") as f:
        f.write("# changed\n")
    with pytest.raises(CorpusError, match="has changed"):
        corpus_from_record(record)
