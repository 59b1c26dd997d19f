"""Induction benchmarks: named tasks, disjoint train/test splits and their metrics (numpy only).

Contract:
- `get_task(name, **params)` returns a `Task`; unknown names or parameters raise `TaskError`.
  Text corpora are the other kind of task (`text.TextTask`, the same interface);
  `task_from_dict` rebuilds either from what a checkpoint recorded; `scored_task` picks the
  task eval and quant-check score a model on (its own, or the one named, of its vocabulary).
- `Task.sample(split, n, seed)` is deterministic in `(split, n, seed)`. The split of an example is
  a fixed function of its tokens (a hash), so the train and test splits can never share an example
  whatever seeds are used.
- `Task.score(predictions, targets, inputs)` returns the task's metrics from argmax predictions
  `[n, T]`;
  "accuracy" is the headline number (ih-safari and ih-offset: last position; ih-sht: all scored
  positions; mqar: per-example mean).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from psa_edge import LENGTH_MAX, is_integer
from psa_edge.errors import TaskError
from psa_edge.tasks import induction
from psa_edge.tasks.induction import IGNORE

SPLITS = ("train", "test")
EVAL_SEED = 1234  # fixed so that every run of a task is scored on the same held-out set
TEST_FRACTION_MODULUS = 10  # one example in ten (by hash) belongs to the test split
_HASH_PRIME = 2_147_483_647


@dataclass(frozen=True)
class TaskDef:
    generate: Callable
    defaults: dict
    vocab: Callable[[dict], int]     # vocabulary size from the task's parameters
    chance: Callable[[dict], float]  # accuracy of uniform guessing over possible targets
    metric: str                      # "last" position, "all" scored positions, "per-example"


TASKS: dict[str, TaskDef] = {
    "ih-safari": TaskDef(induction.ih_safari, dict(seq_len=30, num_ordinary=18),
                         lambda p: p["num_ordinary"] + 2, lambda p: 1 / p["num_ordinary"],
                         "last"),
    "ih-offset": TaskDef(induction.ih_offset, dict(seq_len=30, num_ordinary=18, max_offset=4),
                         lambda p: 2 * p["num_ordinary"] + 2, lambda p: 1 / p["num_ordinary"],
                         "last"),
    "ih-sht": TaskDef(induction.ih_sht, dict(seq_len=256, alphabet=64),
                      lambda p: p["alphabet"], lambda p: 1 / p["alphabet"], "all"),
    # mqar values live in the upper half of the vocabulary.
    "mqar": TaskDef(induction.mqar, dict(seq_len=64, vocab_size=8192, num_pairs=4),
                    lambda p: p["vocab_size"], lambda p: 2 / p["vocab_size"], "per-example"),
}


@dataclass(frozen=True)
class Task:
    name: str
    params: dict = field(default_factory=dict)

    @property
    def definition(self) -> TaskDef:
        return TASKS[self.name]

    @property
    def vocab_size(self) -> int:
        return self.definition.vocab(self.params)

    @property
    def seq_len(self) -> int:
        return self.params["seq_len"]

    @property
    def chance(self) -> float:
        """Accuracy of uniform guessing over the tokens a target can be."""
        return self.definition.chance(self.params)

    def to_dict(self) -> dict:
        return {"name": self.name, "params": dict(self.params)}

    def sample(self, split: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        if split not in SPLITS:
            raise TaskError(f"unknown split {split!r}; choose train or test")
        if n < 1:
            raise TaskError(f"number of samples must be positive, got {n}")
        rng = np.random.default_rng([seed, SPLITS.index(split), 0x5A5A])
        want_test = split == "test"
        kept_inputs, kept_targets, have = [], [], 0
        while have < n:
            draw = max(16, (n - have) * (TEST_FRACTION_MODULUS + 1 if want_test else 2))
            inputs, targets = self.definition.generate(rng, draw, **self.params)
            keep = is_test_example(inputs) == want_test
            kept_inputs.append(inputs[keep])
            kept_targets.append(targets[keep])
            have += int(keep.sum())
        return (np.concatenate(kept_inputs)[:n].astype(np.int64),
                np.concatenate(kept_targets)[:n].astype(np.int64))

    def score(self, predictions: np.ndarray, targets: np.ndarray, inputs=None) -> dict:
        scored = targets != IGNORE
        correct = (predictions == targets) & scored
        last = correct[:, -1].sum() / max(1, scored[:, -1].sum())
        metric = self.definition.metric
        if metric == "per-example":
            accuracy = float(np.mean(correct.sum(1) / np.maximum(1, scored.sum(1))))
        elif metric == "last":
            accuracy = float(last)
        else:
            accuracy = float(correct.sum() / max(1, scored.sum()))
        return {"accuracy": accuracy, "last_accuracy": float(last),
                "scored_positions": int(scored.sum())}


def is_test_example(inputs: np.ndarray) -> np.ndarray:
    """Which rows belong to the test split: a fixed polynomial hash of the tokens."""
    seq_len = inputs.shape[1]
    weights = np.random.default_rng(20260929).integers(1, 2**20, size=seq_len)
    h = (inputs.astype(np.int64) * weights).sum(axis=1) % _HASH_PRIME
    return h % TEST_FRACTION_MODULUS == 0


def get_task(name: str, **params) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    d = TASKS[name]
    unknown = sorted(set(params) - set(d.defaults))
    if unknown:
        raise TaskError(f"task {name} has no parameter {', '.join(unknown)}")
    merged = {**d.defaults, **{k: v for k, v in params.items() if v is not None}}
    for key, value in merged.items():  # each a length or a count of tokens
        if not is_integer(value, 1, LENGTH_MAX):
            raise TaskError(f"task {name}: {key} = {value!r} is not an integer in [1, "
                            f"{LENGTH_MAX}]")
    if merged["seq_len"] < 8:
        raise TaskError(f"task {name} needs seq_len >= 8, got {merged['seq_len']}")
    if name == "ih-offset" and not 1 <= merged["max_offset"] <= merged["seq_len"] - 3:
        raise TaskError(f"ih-offset: max_offset must be in [1, seq_len - 3], got "
                        f"{merged['max_offset']}")
    if name == "mqar" and 4 * merged["num_pairs"] + 1 > merged["seq_len"]:
        raise TaskError(f"mqar: seq_len {merged['seq_len']} too short for "
                        f"{merged['num_pairs']} pairs")
    return Task(name, merged)


def task_from_dict(d: dict, tokenizer=None):
    """The task a model recorded: an induction benchmark, or its text corpus (read again and
    checked against its recorded hash), tokenized with the model's own tokenizer."""
    if d.get("name") == "text":
        from psa_edge.tasks.text import TextTask, corpus_from_record

        if tokenizer is None:
            raise TaskError("a text task needs the model's tokenizer")
        params = d.get("params")
        if not is_text_record(params):
            raise TaskError("the recorded text task is not {seq_len, val_percent, corpus: "
                            "{root, files, sha256}}")
        return TextTask(corpus_from_record(params["corpus"]), tokenizer, params["seq_len"],
                        params["val_percent"])
    return get_task(d["name"], **d.get("params", {}))


def is_text_record(params) -> bool:
    """Whether `params` is a text task's record as TextTask.params writes it."""
    corpus = params.get("corpus") if isinstance(params, dict) else None
    return (isinstance(corpus, dict) and is_integer(params.get("seq_len"), 8, LENGTH_MAX)
            and is_integer(params.get("val_percent"), 1, 99)
            and isinstance(corpus.get("root"), str) and isinstance(corpus.get("sha256"), str)
            and isinstance(corpus.get("files"), list)
            and all(isinstance(f, str) for f in corpus["files"]))


def scored_task(recorded: dict | None, name: str | None, tokenizer, vocab_size: int,
                source) -> object:
    """The task a model from `source` is scored on (eval, quant-check): the one it recorded,
    unless `name` picks another, with the recorded parameters when it names the same task.
    Refused when none is recorded and none is named, or when the task's vocabulary is not the
    model's `vocab_size`."""
    recorded = recorded or {}
    if name is None:
        if not recorded:
            raise TaskError(f"{source} records no task; pass --task")
        task = task_from_dict(recorded, tokenizer)
    else:
        task = get_task(name, **(recorded.get("params", {}) if recorded.get("name") == name
                                 else {}))
    if task.vocab_size != vocab_size:
        raise TaskError(f"task {task.name} has vocabulary {task.vocab_size}, the model's is "
                        f"{vocab_size}")
    return task
