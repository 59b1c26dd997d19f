"""Induction benchmarks: determinism, disjoint splits, and targets against brute force."""

import numpy as np
import pytest

from psa_edge.errors import TaskError
from psa_edge.tasks import IGNORE, get_task, is_test_example, scored_task


@pytest.mark.parametrize("name", ["ih-safari", "ih-offset", "ih-sht", "mqar"])
def test_deterministic_from_seed(name):
    task = get_task(name)
    a, b = task.sample("train", 8, 3), task.sample("train", 8, 3)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], task.sample("train", 8, 4)[0])


@pytest.mark.parametrize("name", ["ih-safari", "ih-offset", "ih-sht", "mqar"])
def test_train_and_test_never_overlap(name):
    task = get_task(name)
    test = {row.tobytes() for row in task.sample("test", 300, 0)[0]}
    train = np.concatenate([task.sample("train", 200, s)[0] for s in range(5)])
    assert not test & {row.tobytes() for row in train}
    assert is_test_example(task.sample("test", 50, 9)[0]).all()
    assert not is_test_example(train).any()


def test_safari_shape_and_target():
    task = get_task("ih-safari")
    x, y = task.sample("train", 200, 0)
    assert x.shape == (200, 30) and task.vocab_size == 20
    trigger = 18
    for row, target in zip(x, y):
        body = row[:-1]
        assert row[-1] == trigger and (body == trigger).sum() == 1
        pos = int(np.flatnonzero(body == trigger)[0])
        assert target[-1] == row[pos + 1] < 18
        assert (target[:-1] == IGNORE).all()
        counts = np.bincount(body[body != trigger], minlength=18)
        assert counts.max() - counts.min() <= 1  # no bag-of-tokens shortcut
    assert not (x == 19).any()  # the no-op is reserved


def test_offset_shape_and_target():
    task = get_task("ih-offset", max_offset=5)
    x, y = task.sample("train", 200, 0)
    assert task.vocab_size == 38 and task.chance == 1 / 18
    offsets = set()
    for row, target in zip(x, y):
        trigger_pos = np.flatnonzero(row[:-1] == 18)
        marked = np.flatnonzero(row >= 20)
        assert row[-1] == 18 and len(trigger_pos) == 1 and len(marked) == 1
        offsets.add(int(marked[0] - trigger_pos[0]))
        assert target[-1] == row[marked[0]] - 20 and (target[:-1] == IGNORE).all()
    assert offsets == {1, 2, 3, 4, 5}  # the answer is not always the trigger's successor


def test_sht_targets_brute_force():
    task = get_task("ih-sht", seq_len=40, alphabet=8)
    x, y = task.sample("test", 20, 0)
    for row, target in zip(x, y):
        for t in range(40):
            earlier = [j for j in range(t) if row[j] == row[t]]
            assert target[t] == (row[earlier[-1] + 1] if earlier else IGNORE)
        assert target[-1] != IGNORE


def test_mqar_targets():
    task = get_task("mqar", seq_len=32, vocab_size=100, num_pairs=3)
    x, y = task.sample("train", 30, 0)
    for row, target in zip(x, y):
        pairs = dict(zip(row[0:6:2], row[1:6:2]))
        assert all(k < 50 <= v for k, v in pairs.items())
        scored = np.flatnonzero(target != IGNORE)
        assert len(scored) == 3 and (scored >= 6).all()
        for pos in scored:
            assert target[pos] == pairs[row[pos]] == row[pos + 1]


def test_scores():
    task = get_task("ih-sht", seq_len=16, alphabet=4)
    x, y = task.sample("test", 10, 0)
    perfect = np.where(y == IGNORE, 0, y)
    assert task.score(perfect, y)["accuracy"] == 1.0
    assert task.score(perfect, y)["last_accuracy"] == 1.0
    assert task.score(np.full_like(y, -5), y)["accuracy"] == 0.0


@pytest.mark.parametrize("call", [lambda: get_task("induction"),
                                  lambda: get_task("ih-sht", colour=3),
                                  lambda: get_task("ih-safari", seq_len=3),
                                  lambda: get_task("mqar", seq_len=10, num_pairs=4),
                                  lambda: get_task("ih-offset", max_offset=0),
                                  lambda: get_task("mqar").sample("valid", 3, 0),
                                  lambda: get_task("mqar").sample("test", 0, 0)])
def test_bad_task_input(call):
    with pytest.raises(TaskError):
        call()


def test_the_scored_task_is_the_recorded_one_unless_another_is_named():
    """eval and quant-check pick the task the same way (`scored_task`): the model's own, or the
    named one, with the recorded parameters when it names the same task."""
    recorded = get_task("ih-sht", seq_len=64).to_dict()
    own = scored_task(recorded, None, None, 64, "m.pt")
    assert (own.name, own.seq_len) == ("ih-sht", 64)
    named = scored_task(recorded, "ih-sht", None, 64, "m.pt")
    assert named.seq_len == 64  # quant-check took the task's defaults (256) here
    other = scored_task(recorded, "ih-safari", None, 20, "m.pt")
    assert (other.name, other.seq_len) == ("ih-safari", 30)
    with pytest.raises(TaskError, match="m.pt records no task; pass --task"):
        scored_task(None, None, None, 64, "m.pt")
    with pytest.raises(TaskError, match="task ih-sht has vocabulary 64, the model's is 20"):
        scored_task(recorded, None, None, 20, "m.pt")
