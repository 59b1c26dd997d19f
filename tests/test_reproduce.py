"""The measurements behind docs/results/reproduction.md (tools/reproduce.py): the onset estimate,
the frequency-response estimator against a filter whose response is known, and the premise of
the negative control (plain 1-layer attention solves ih-offset)."""

import sys

import numpy as np
import torch

from conftest import REPO
from psa_edge import theory
from psa_edge.model.ops import shear

sys.path.insert(0, str(REPO / "tools"))
import reproduce  # noqa: E402


def test_onset_interpolates_the_first_crossing():
    assert abs(reproduce.onset([0.0, 0.1, 0.2], [0.1, 0.3, 0.7]) - 0.15) < 1e-12
    assert reproduce.onset([0.0, 0.5], [0.6, 0.9]) == 0.0
    assert reproduce.onset([0.0, 0.5, 1.0], [0.1, 0.2, 0.3]) is None


def test_measured_response_recovers_the_shear_and_tells_a_wrong_filter():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(64, 256)))[None]
    zero = torch.zeros(1, 64, 1)
    y = shear(x.transpose(1, 2), zero.transpose(1, 2), 0.8).transpose(1, 2)[0].numpy()
    omega, h = reproduce.measured_response(x[0].numpy(), y)
    closed = np.abs(theory.transfer(omega, 0.8))
    band = omega > 0
    assert np.max(np.abs(np.abs(h[band]) - closed[band]) / closed[band]) < 0.05
    # A non-causal difference (x_t - x_{t+1}) has the same gain but the opposite phase.
    wrong = x[0].numpy() + 0.8 * (x[0].numpy() - np.roll(x[0].numpy(), -1, axis=1))
    _, h_wrong = reproduce.measured_response(x[0].numpy(), wrong)
    phase = np.angle(theory.transfer(omega, 0.8))
    assert np.abs(np.angle(h[band]) - phase[band]).max() < 0.1
    assert np.abs(np.angle(h_wrong[band]) - phase[band]).max() > 0.5


def test_plain_single_layer_attention_solves_the_negative_control():
    from psa_edge.tasks import get_task
    from psa_edge.train.trainer import TrainSpec, train

    torch.set_num_threads(1)
    spec = TrainSpec(task="ih-offset", preset="tiny", variant="baseline", layers=1, steps=100,
                     eval_every=100, task_params=reproduce.CONTROL_TASK)
    result = train(spec, get_task(spec.task, **spec.task_params))
    assert result.final["accuracy"] >= 0.9, result.final
