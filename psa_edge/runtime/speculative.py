"""Speculative decoding (docs/reference/spec.md §5): a drafter proposes, the target verifies
in one call.

Contract:
- A drafter has `propose(context, k, sampling, rng) -> (tokens, distributions)`: up to `k`
  next tokens after `context` (every token so far) and, per token, the distribution it was
  drawn from (None for a deterministic drafter, which means one-hot on the proposal).
  `SessionDrafter` runs a draft artifact (a smaller model or the int8 build of the target);
  `PromptLookupDrafter` proposes what followed the most recent earlier occurrence of the
  context's suffix (the induction pattern itself); `ShiftedDrafter` wraps a drafter and shifts
  every proposal by one id, so it never agrees (for `verify`).
- `speculative_generate(target, drafter, prompt, ...)` keeps one token pending (chosen, not yet
  fed). Each round the target is fed `[pending, d_1..d_k]` in ONE call (S = k + 1); the
  accepted run is the longest agreeing prefix plus the target's own next token, and the target
  is rolled back (`Session.rollback`: caches cut, previous-key slot set from the raw keys) to
  the positions it keeps. Greedy: accept while the draft equals the target's argmax. Sampling:
  accept d with probability min(1, p(d)/q(d)), else draw from norm(max(0, p - q)); after k
  acceptances draw a bonus token from p. The output distribution is then the target's.
- Statistics: drafted, accepted, acceptance rate, target calls, tokens per target call.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from psa_edge.errors import ArtifactError
from psa_edge.runtime.generate import (Generation, Sampling, Stop, check_request, distribution,
                                       draw)
from psa_edge.runtime.session import Session


def sync(session: Session, context: list[int]) -> None:
    """Bring a session to have processed `context[:-1]` plus possibly more of it: roll back to
    the longest common prefix (reset if that is out of rollback reach), then feed the rest but
    the last token, which `propose` feeds with its first step."""
    have = session.tokens
    common = 0
    for a, b in zip(have, context):
        if a != b:
            break
        common += 1
    common = min(common, len(context) - 1)
    if common < session.rollback_floor:
        session.reset()
    elif common < session.length:
        session.rollback(common)
    if session.length < len(context) - 1:
        session.feed(context[session.length:-1], last_only=True)


class SessionDrafter:
    """Draft tokens from a draft artifact's own session (same vocabulary as the target)."""

    def __init__(self, session: Session, target_vocab: int):
        if session.io.vocab_size != target_vocab:
            raise ArtifactError(f"draft has vocabulary {session.io.vocab_size}, the target "
                                f"{target_vocab}; a draft must share the target's vocabulary")
        self.session = session

    def propose(self, context: list[int], k: int, sampling: Sampling, rng):
        # A draft with a shorter max length than the target proposes what fits, maybe nothing.
        k = min(k, self.session.io.max_seq_len - len(context) + 1)
        if k <= 0:
            return [], []
        sync(self.session, context)
        tokens, dists = [], []
        feed = [context[-1]]
        for _ in range(k):
            probs = distribution(self.session.feed(feed)[-1], sampling)
            token = int(probs.argmax()) if sampling.greedy else draw(probs, rng)
            tokens.append(token)
            dists.append(probs)
            feed = [token]
        return tokens, dists


class PromptLookupDrafter:
    """Propose the continuation of the most recent earlier occurrence of the context's last
    n tokens (n from `max_ngram` down to 1): draft-free, and exactly the induction pattern."""

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def propose(self, context: list[int], k: int, sampling: Sampling, rng):
        seq = np.asarray(context)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            suffix = seq[-n:]
            # Candidate starts i < len - n with seq[i:i+n] == suffix, most recent first.
            for start in range(len(seq) - n - 1, -1, -1):
                if np.array_equal(seq[start:start + n], suffix):
                    follow = seq[start + n:start + n + k]
                    return [int(t) for t in follow], None
        return [], None


class ShiftedDrafter:
    """Every proposal of `inner` moved to the next id: a draft that never agrees."""

    def __init__(self, inner, vocab_size: int):
        self.inner, self.vocab_size = inner, vocab_size

    def propose(self, context, k, sampling, rng):
        tokens, _ = self.inner.propose(context, k, Sampling(), rng)
        return [(t + 1) % self.vocab_size for t in tokens], None


def accept(logits: np.ndarray, drafts: list[int], dists, sampling: Sampling, rng
           ) -> tuple[int, int]:
    """(number of drafts accepted, the target's own next token) for one verify call."""
    for i, token in enumerate(drafts):
        p = distribution(logits[i], sampling)
        if sampling.greedy:
            if token == int(p.argmax()):
                continue
            return i, int(p.argmax())
        q = dists[i] if dists is not None else np.eye(p.size)[token]
        if rng.random() < min(1.0, p[token] / q[token]):
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()  # > 0 whenever a rejection is possible, but for rounding
        return i, draw(residual / total if total > 0 else p, rng)
    p = distribution(logits[len(drafts)], sampling)
    return len(drafts), int(p.argmax()) if sampling.greedy else draw(p, rng)


def speculative_generate(target: Session, drafter, prompt, max_new_tokens: int,
                         draft_len: int = 4, sampling: Sampling = Sampling(), stop: Stop = Stop(),
                         on_token: Callable[[int], None] | None = None) -> Generation:
    prompt = check_request(target, prompt, max_new_tokens)
    rng = np.random.default_rng(sampling.seed)
    target.reset()
    started = time.perf_counter()
    if prompt.size > 1:
        target.feed(prompt[:-1], last_only=True)
    context = [int(t) for t in prompt]
    result = Generation([], "max_tokens", int(prompt.size), graph_calls=int(prompt.size > 1))
    result.prefill_seconds = time.perf_counter() - started
    drafted = accepted = 0
    while True:
        room = max_new_tokens - len(result.tokens) - 1  # the target adds one token itself
        k = max(0, min(draft_len, room, target.io.max_seq_len - len(context)))
        started = time.perf_counter()
        drafts, dists = drafter.propose(context, k, sampling, rng) if k else ([], None)
        start = target.length
        logits = target.feed([context[-1], *drafts])
        n_accepted, own = accept(logits, drafts, dists, sampling, rng)
        target.rollback(start + 1 + n_accepted)
        result.decode_seconds += time.perf_counter() - started
        result.graph_calls += 1
        drafted, accepted = drafted + len(drafts), accepted + n_accepted
        done = False
        for token in [*drafts[:n_accepted], own]:
            context.append(token)
            done = result.emit(token, on_token, stop, max_new_tokens)
            if done:
                break
        if done:
            break
    verify_calls = result.graph_calls - int(prompt.size > 1)
    result.stats = {"drafted": drafted, "accepted": accepted,
                    "acceptance_rate": accepted / drafted if drafted else None,
                    "target_calls": verify_calls,
                    "tokens_per_target_call": len(result.tokens) / max(1, verify_calls)}
    return result
