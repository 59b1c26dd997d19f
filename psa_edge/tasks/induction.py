"""Generators of the three induction benchmarks (numpy only, deterministic from a generator).

Each generator returns `(inputs, targets)`, int64 arrays `[n, seq_len]`; `targets` holds the
token the model must predict AT that position (read from the logits of that position) and
`IGNORE` elsewhere.

- ih-safari (H3 / safari "induction head"): vocab 20 = 18 ordinary tokens, a trigger (18) and a
  no-op (19; safari's reserved filler, never emitted here). Ordinary tokens in random order, each
  appearing equally often (+-1); the trigger occurs once in the body followed by the target
  token, and once more as the last token. Only the last position is scored; chance is 1/18.
- ih-sht (Sanford-Hsu-Telgarsky): uniform tokens over the alphabet; at every position whose
  token occurred before, the target is the token after its most recent previous occurrence. The
  last token is drawn from the tokens already seen (so the last-position metric is always defined).
- ih-offset (the negative control): ih-safari's layout, but the answer is a *marked* token (its
  own id range, num_ordinary + 2 + x) placed at a random offset 1..max_offset after the body
  trigger, and the target is its ordinary token x. The answer is found by its own content, not
  by its predecessor, so plain single-layer attention can solve it and the shear has nothing to
  add. Only the last position is scored; chance is 1/num_ordinary.
- mqar (Zoology multi-query associative recall): `num_pairs` key-value pairs at the start (keys
  from the lower half of the vocab, values from the upper half), then every key queried once at a
  random later position, the value following it; other positions are the filler token 0. The
  target at a query position is its value.
"""

from __future__ import annotations

import numpy as np

IGNORE = -1


def balanced_body(rng: np.random.Generator, n: int, body_len: int, num_ordinary: int):
    """Ordinary tokens in random order, each appearing floor or ceil of body_len / num_ordinary
    times. With i.i.d. tokens an answer that has a forced occurrence is over-represented in the
    sequence, a bag-of-tokens shortcut that a 1-layer model without induction would learn."""
    tokens = np.argsort(rng.random((n, num_ordinary)), axis=1)
    reps = -(-body_len // num_ordinary)
    body = np.tile(tokens, reps)[:, :body_len]
    return np.take_along_axis(body, np.argsort(rng.random((n, body_len)), axis=1), axis=1)


def ih_safari(rng: np.random.Generator, n: int, seq_len: int = 30, num_ordinary: int = 18):
    trigger = num_ordinary
    body_len = seq_len - 2  # every position but the body trigger and the final trigger
    body = balanced_body(rng, n, body_len, num_ordinary)
    # The body trigger sits where its target is followed by at least one more body token.
    trigger_pos = rng.integers(0, seq_len - 2, size=n)
    positions = np.arange(seq_len - 1)[None, :]
    source = np.clip(positions - (positions > trigger_pos[:, None]), 0, body_len - 1)
    inputs = np.empty((n, seq_len), dtype=np.int64)
    inputs[:, :-1] = np.take_along_axis(body, source, axis=1)
    rows = np.arange(n)
    inputs[rows, trigger_pos] = trigger
    inputs[:, -1] = trigger
    targets = np.full((n, seq_len), IGNORE)
    targets[:, -1] = inputs[rows, trigger_pos + 1]
    return inputs, targets


def ih_offset(rng: np.random.Generator, n: int, seq_len: int = 30, num_ordinary: int = 18,
              max_offset: int = 4):
    trigger = num_ordinary
    inputs = np.empty((n, seq_len), dtype=np.int64)
    inputs[:, :-1] = balanced_body(rng, n, seq_len - 1, num_ordinary)
    inputs[:, -1] = trigger
    rows = np.arange(n)
    trigger_pos = rng.integers(0, seq_len - 1 - max_offset, size=n)
    answer_pos = trigger_pos + rng.integers(1, max_offset + 1, size=n)
    answer = rng.integers(0, num_ordinary, size=n)
    inputs[rows, trigger_pos] = trigger
    inputs[rows, answer_pos] = num_ordinary + 2 + answer  # the marked copy of the answer
    targets = np.full((n, seq_len), IGNORE)
    targets[:, -1] = answer
    return inputs, targets


def ih_sht(rng: np.random.Generator, n: int, seq_len: int = 256, alphabet: int = 64):
    inputs = rng.integers(0, alphabet, size=(n, seq_len))
    # Last token repeats one seen at a position whose successor is before the last position.
    inputs[:, -1] = inputs[np.arange(n), rng.integers(0, seq_len - 2, size=n)]
    targets = np.full((n, seq_len), IGNORE)
    last_seen = np.full((n, alphabet), -1)
    rows = np.arange(n)
    for t in range(seq_len):
        tok = inputs[:, t]
        prev = last_seen[rows, tok]
        seen = prev >= 0
        targets[seen, t] = inputs[rows[seen], prev[seen] + 1]
        last_seen[rows, tok] = t
    return inputs, targets


def mqar(rng: np.random.Generator, n: int, seq_len: int = 64, vocab_size: int = 8192,
         num_pairs: int = 4):
    half = vocab_size // 2
    context = 2 * num_pairs
    inputs = np.zeros((n, seq_len), dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE)
    # Query slots are the even offsets of the tail, so a query and its value never overlap.
    slots = np.arange(context, seq_len - 1, 2)
    for i in range(n):
        keys = rng.choice(np.arange(1, half), size=num_pairs, replace=False)
        values = rng.integers(half, vocab_size, size=num_pairs)
        inputs[i, 0:context:2], inputs[i, 1:context:2] = keys, values
        query_pos = np.sort(rng.choice(slots, size=num_pairs, replace=False))
        order = rng.permutation(num_pairs)
        inputs[i, query_pos] = keys[order]
        inputs[i, query_pos + 1] = values[order]
        targets[i, query_pos] = values[order]
    return inputs, targets
