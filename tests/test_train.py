"""A short training run shows the mechanism: 1-layer key-only learns induction, baseline cannot."""

import torch

from psa_edge.train.trainer import TrainSpec, evaluate, lr_at, train


def test_key_only_beats_baseline_in_a_short_run():
    torch.set_num_threads(1)
    common = dict(task="ih-safari", preset="tiny", steps=150, eval_every=150, batch_size=32)
    psa = train(TrainSpec(variant="key-only", **common))
    base = train(TrainSpec(variant="baseline", **common))
    chance = psa.task.chance
    assert psa.final["accuracy"] >= 0.9, psa.final
    assert base.final["accuracy"] <= chance + 0.1, base.final
    assert psa.steps_to_90 is not None and base.steps_to_90 is None
    # evaluate() scores the same held-out set the trainer used
    assert evaluate(psa.model, psa.task, 512)["accuracy"] == psa.final["accuracy"]


def test_lr_schedule():
    spec = TrainSpec(steps=100, warmup=10, lr=1.0)
    assert lr_at(0, spec) == 0.1 and lr_at(9, spec) == 1.0
    assert abs(lr_at(99, spec) - 0.1) < 1e-3
