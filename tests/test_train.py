"""Training: the mechanism in a short run, the schedule, data-parallel processes against one,
resuming against an uninterrupted run, the device of every tensor the model builds, and a GPU
run where there is one."""

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from psa_edge.errors import ConfigError
from psa_edge.model.checkpoint import read_checkpoint
from psa_edge.tasks import get_task
from psa_edge.train import check_device
from psa_edge.train.trainer import TrainSpec, evaluate, lr_at, resolve_device, train

SHORT = ["--task", "ih-sht", "--seq-len", "32", "--preset", "tiny", "--layers", "2", "--steps",
         "6", "--batch-size", "8", "--eval-every", "3", "--eval-samples", "16", "--lr", "0.01",
         "--device", "cpu"]


def run(*args, env=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def weights(path):
    return read_checkpoint(path)["state_dict"]


def test_key_only_beats_baseline_in_a_short_run():
    torch.set_num_threads(1)
    common = dict(task="ih-safari", preset="tiny", steps=150, eval_every=150, batch_size=32)
    task = get_task("ih-safari")
    psa = train(TrainSpec(variant="key-only", **common), task)
    base = train(TrainSpec(variant="baseline", **common), task)
    chance = psa.task.chance
    assert psa.final["accuracy"] >= 0.9, psa.final
    assert base.final["accuracy"] <= chance + 0.1, base.final
    assert psa.steps_to_90 is not None and base.steps_to_90 is None
    # evaluate() scores the same held-out set the trainer used
    assert evaluate(psa.model, psa.task, 512)["accuracy"] == psa.final["accuracy"]


@pytest.mark.parametrize("name,known", [
    ("auto", True), ("cpu", True), ("cuda", True), ("cuda:0", True), ("cuda:12", True),
    ("cuda:", False), ("cuda:-1", False), ("cuda:0:1", False), ("CPU", False), ("gpu", False),
])
def test_device_names(name, known):
    """The CLI refuses an unknown name before torch's import (`check_device`); the trainer's
    own check is the same one, and says when a known CUDA device is not here."""
    if not known:
        for check in (check_device, resolve_device):
            with pytest.raises(ConfigError, match=f"unknown device '{re.escape(name)}'; "
                               "choose one of auto, cpu, cuda, cuda:N"):
                check(name)
        return
    assert check_device(name) is None
    if name.startswith("cuda") and not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU is available here"):
            resolve_device(name)
    else:
        assert resolve_device(name) in ("cpu", "cuda", name)


def test_the_library_refuses_a_weights_dtype_before_any_work(tmp_path):
    """The CLI refuses it while parsing; a caller of the Python API gets the same refusal."""
    from psa_edge.train.run import prepare

    with pytest.raises(ConfigError, match="unknown weights dtype 'int8'; choose one of float32"):
        prepare(TrainSpec(weights_dtype="int8"), tmp_path / "m.pt")
    assert os.listdir(tmp_path) == []


def test_lr_schedule():
    spec = TrainSpec(steps=100, warmup=10, lr=1.0)
    assert lr_at(0, spec) == 0.1 and lr_at(9, spec) == 1.0
    assert abs(lr_at(99, spec) - 0.1) < 1e-3


def test_two_data_parallel_processes_train_the_weights_of_one(tmp_path):
    """torchrun, 2 processes over gloo, each with half of every global batch: the weights of one
    process with the whole batch (ih-sht scores a different number of positions per row, so a
    per-process mean loss would not do). Only the main process writes."""
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    assert run("psa_edge.cli", "train", *SHORT, "-o", one).returncode == 0
    result = run("psa_edge.cli", "train", *SHORT, "-o", two, "--nproc", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = weights(one), weights(two)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{stem}{suffix}" for stem in ("one", "two")
        for suffix in (".pt", ".pt.json", ".metrics.jsonl", ".curve.png"))


def test_resume_continues_to_the_weights_of_an_uninterrupted_run(tmp_path):
    whole, parted = tmp_path / "whole.pt", tmp_path / "parted.pt"
    assert run("psa_edge.cli", "train", *SHORT, "-o", whole).returncode == 0
    first = run("psa_edge.cli", "train", *SHORT, "--state-every", "3", "-o", parted)
    assert first.returncode == 0, first.stderr[-2000:]
    state = tmp_path / "parted.state.pt"
    parted.unlink()  # as if the run had died after step 3
    result = run("psa_edge.cli", "train", "--resume", state, "--device", "cpu", "-o", parted)
    assert result.returncode == 0, result.stderr[-2000:]
    a, b = weights(whole), weights(parted)
    assert all(torch.equal(a[name], b[name]) for name in a)
    rows = [line for line in (tmp_path / "parted.metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # the evaluation at step 3 carried over from the state, and step 6


@pytest.fixture(scope="module")
def training_state(tmp_path_factory):
    """The payload of a training state after step 3 of SHORT's 6."""
    folder = tmp_path_factory.mktemp("state")
    done = run("psa_edge.cli", "train", *SHORT, "--state-every", "3", "-o", folder / "m.pt")
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(folder / "m.state.pt", weights_only=True)


def nested_set(payload: dict, path: str, value) -> dict:
    """A copy of `payload` with the item at `path` ("a.0.b": digits index lists, and the int
    keys of the optimizer's state) set to `value`."""
    import copy

    def key_in(target, key: str):
        return int(key) if key.isdigit() and key not in target else key

    payload = copy.deepcopy(payload)
    *parents, last = path.split(".")
    target = payload
    for key in parents:
        target = target[key_in(target, key)]
    target[key_in(target, last)] = value
    return payload


@pytest.mark.parametrize("path,value,message", [
    ("metadata.spec.steps", "6", "records steps = '6', not an integer in [1, 1000000000]"),
    ("metadata.spec.lr", 0.0, "records lr = 0.0, not a number in (0.0, 10.0]"),
    ("metadata.spec.batch_size", True, "records batch_size = True, not an integer"),
    ("metadata.spec.stop_at", float("nan"), "records stop_at = nan, not a number in [0.0, 1.0]"),
    ("metadata.spec.text", "corpus/", "records text = 'corpus/', not a list"),
    ("metadata.spec.preset", "psa-1b", "records an unknown preset 'psa-1b'"),
    ("metadata.spec.device", "tpu", "unknown device 'tpu'"),
    ("metadata.spec", {}, "records no training option batch_size"),
    ("metadata.spec.extra", 1, "records an unknown training option extra"),
    ("metadata.task.params.seq_len", {}, "task ih-sht: seq_len = {} is not an integer"),
    ("metadata.task.params.alphabet", 2**63, "alphabet = 9223372036854775808 is not"),
    ("step", -1, "records step -1, before the first"),
    ("step", 7, "records step 7 of a 6-step run"),
    ("history.0", 0.5, "has a history row that is not a step's metrics"),
    ("history.0.accuracy", "high", "has a history row that is not a step's metrics"),
])
def test_a_damaged_training_state_is_refused_before_training(training_state, tmp_path, path,
                                                            value, message):
    """Found by feeding each field of a state junk: these were tracebacks (TypeError,
    KeyError) from deep inside the trainer."""
    from psa_edge.errors import PsaEdgeError
    from psa_edge.train.run import prepare

    state = tmp_path / "m.state.pt"
    torch.save(nested_set(training_state, path, value), state)
    with pytest.raises(PsaEdgeError) as refused:
        prepare(TrainSpec(device="cpu"), tmp_path / "out.pt", resume=state)
    assert message in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.state.pt"]


@pytest.mark.parametrize("path,value,message", [
    ("optimizer.param_groups", 3, "has other parameter groups than its model"),
    ("optimizer.param_groups.0.params", [0, 99], "has other parameter groups than its model"),
    ("optimizer.state.99", {}, "holds moments of no parameter"),
    ("optimizer.state.0.exp_avg", torch.zeros(3), "moments of parameter 0 do not fit it"),
    ("optimizer.state.0.exp_avg_sq", "x", "moments of parameter 0 do not fit it"),
    ("optimizer.state.0.step", torch.tensor(-1.0), "moments of parameter 0 do not fit it"),
])
def test_a_training_state_whose_optimizer_does_not_fit_is_refused_in_one_line(
        training_state, tmp_path, path, value, message):
    """These failed inside AdamW's step (a traceback, exit 1), or ran on NaN moments."""
    state = tmp_path / "m.state.pt"
    torch.save(nested_set(training_state, path, value), state)
    result = run("psa_edge.cli", "train", "--resume", state, "-o", tmp_path / "out.pt")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert f"the training state's optimizer {message}" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.state.pt"]


@pytest.mark.parametrize("extra,message", [
    (["--init", "INIT"], "--init and --tokenizer cannot be given with it"),
    (["--text", "CORPUS"], "is not the corpus the resumed run records"),
])
def test_resume_refuses_an_option_it_would_ignore(training_state, tmp_path, extra, message):
    """Both exited 0 and trained the recorded run, ignoring the option."""
    state = tmp_path / "m.state.pt"
    torch.save(training_state, state)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.py").write_text("x = 1\n" * 100)
    paths = {"INIT": str(REPO / "models" / "psa-default.pt"), "CORPUS": str(tmp_path / "corpus")}
    result = run("psa_edge.cli", "train", "--resume", state, *[paths.get(a, a) for a in extra],
                 "-o", tmp_path / "out.pt")
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out.pt").exists()


def test_the_command_line_bounds_are_the_ones_a_training_state_is_checked_by():
    import dataclasses

    from psa_edge.cli import app
    from psa_edge import TRAIN_RANGES
    from psa_edge.train import SPEC_KINDS
    from typer import BadParameter
    from typer.main import get_command

    assert set(TRAIN_RANGES) | set(SPEC_KINDS) == {f.name for f in dataclasses.fields(TrainSpec)}
    options = {p.name: p for p in get_command(app).commands["train"].params}
    for name, (low, high, kind) in TRAIN_RANGES.items():
        if name in ("warmup", "weight_decay"):  # not command-line options
            continue
        if kind is int:
            assert (options[name].min, options[name].max) == (low, high), name
        else:
            check = options[name].callback
            assert check(None, None, high) == high and check(None, None, low + 1e-9), name
            for outside in (high * 1.01, low - 1e-6, float("nan")):
                with pytest.raises(BadParameter):
                    check(None, None, outside)


@pytest.mark.parametrize("params,message", [
    ({"seq_len": "32"}, "seq_len = '32' is not an integer"),
    ({"seq_len": True}, "seq_len = True is not an integer"),
    ({"alphabet": 0}, "alphabet = 0 is not an integer in [1, 1048576]"),
])
def test_task_parameters_are_integers_in_range(params, message):
    from psa_edge.errors import TaskError

    with pytest.raises(TaskError, match=re.escape(message)):
        get_task("ih-sht", **params)


def test_a_recorded_text_task_missing_its_corpus_is_refused():
    from psa_edge.errors import TaskError
    from psa_edge.tasks import task_from_dict
    from psa_edge.tokenizer import Tokenizer

    with pytest.raises(TaskError, match="recorded text task is not"):
        task_from_dict({"name": "text", "params": {"seq_len": 64}}, Tokenizer.chars(64))


def test_the_model_builds_no_tensor_on_a_fixed_device():
    """On the "meta" device nothing is computed: every mask, position and RoPE table the forward
    creates must be created there too, or the forward fails on mixing devices."""
    from psa_edge.model import PSATransformer, preset_config

    model = PSATransformer(preset_config("tiny", "symmetric", num_hidden_layers=2)).to("meta")
    logits = model(torch.zeros(2, 9, dtype=torch.long, device="meta"))
    assert logits.device.type == "meta" and logits.shape == (2, 9, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine (CI has "
                    "none); the GPU path runs where one is present")
def test_training_on_a_gpu_writes_a_cpu_checkpoint(tmp_path):
    out = tmp_path / "gpu.pt"
    args = [a if a != "cpu" else "cuda" for a in SHORT]
    result = run("psa_edge.cli", "train", *args, "-o", out)
    assert result.returncode == 0, result.stderr[-2000:]
    state = weights(out)
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state.values())
    cpu = tmp_path / "cpu.pt"
    assert run("psa_edge.cli", "train", *SHORT, "-o", cpu).returncode == 0
    # bf16 autocast against fp32: the same run, to the precision bf16 keeps over 6 steps
    for name, tensor in weights(cpu).items():
        torch.testing.assert_close(state[name], tensor, rtol=0.05, atol=0.02, msg=name)
