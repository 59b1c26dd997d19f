"""Token generation on a session: greedy and sampling (numpy only).

Contract:
- `Sampling(temperature, top_k, top_p, seed)`: temperature 0 is greedy. `distribution(logits,
  sampling)` is the distribution a token is drawn from after temperature, top-k and top-p
  (greedy: one-hot on the argmax); speculative decoding uses the same function for the target
  and the draft, so its output distribution is the one `generate` samples from.
- `generate(session, prompt, max_new_tokens, sampling, stop, on_token)` resets the session,
  feeds the prompt in one call, then one token per call. It stops (`Stop`) after a stop token
  such as the end of text (which is returned), once the decoded text holds a stop string, or
  after `max_new_tokens`. Prompt plus new tokens must fit the artifact's max length, checked
  before anything runs (`SequenceError`). `on_token(id)` is called as each token is chosen
  (streaming). Returns the tokens, why it stopped and the timings (prefill, decode, time to
  first token); choosing tokens is not timed as graph time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from psa_edge.errors import SequenceError
from psa_edge.runtime.session import Session


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise SequenceError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise SequenceError(f"top-k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise SequenceError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def distribution(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """Probabilities over the vocabulary (float64) that `choose` draws from."""
    logits = np.asarray(logits, dtype=np.float64)
    if sampling.greedy:
        out = np.zeros_like(logits)
        out[int(logits.argmax())] = 1.0
        return out
    # The largest logit moved to 0 first: a tiny temperature (1e-320) then sends the others
    # to -inf, not every logit to +-inf (whose difference is NaN).
    scaled = (logits - logits.max()) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scaled.size:
        kth = np.partition(scaled, -sampling.top_k)[-sampling.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if sampling.top_p is not None and sampling.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        # Keep the smallest set of top tokens whose mass reaches top_p.
        keep = np.cumsum(probs[order]) - probs[order] < sampling.top_p
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(probs.size, p=probs))


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    if sampling.greedy:
        return int(np.argmax(logits))
    return draw(distribution(logits, sampling), rng)


@dataclass(frozen=True)
class Stop:
    """When generation ends before its budget: at a token of `tokens` (kept in the output), or
    once `decode(tokens so far)` holds one of `strings`."""
    tokens: frozenset = frozenset()
    strings: tuple[str, ...] = ()
    decode: Callable | None = None

    def reached(self, generated: list[int]) -> str | None:
        if generated and generated[-1] in self.tokens:
            return "stop_token"
        if self.strings and any(s in self.decode(generated) for s in self.strings):
            return "stop_string"
        return None


@dataclass
class Generation:
    tokens: list[int]
    stop_reason: str                      # "stop_token", "stop_string" or "max_tokens"
    prompt_tokens: int
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    graph_calls: int = 0
    stats: dict = field(default_factory=dict)

    def emit(self, token: int, on_token: Callable[[int], None] | None, stop: Stop,
             max_new_tokens: int) -> bool:
        """Record a chosen token (and stream it); True when generation stops after it."""
        self.tokens.append(token)
        if on_token is not None:
            on_token(token)
        reason = stop.reached(self.tokens)
        if reason:
            self.stop_reason = reason
            return True
        return len(self.tokens) == max_new_tokens

    def summary(self) -> dict:
        decode_tokens = max(0, len(self.tokens) - 1)
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": len(self.tokens),
                "stop_reason": self.stop_reason, "graph_calls": self.graph_calls,
                "prefill_seconds": self.prefill_seconds, "decode_seconds": self.decode_seconds,
                "prefill_tokens_per_second": self.prompt_tokens / max(self.prefill_seconds, 1e-9),
                "decode_tokens_per_second": (decode_tokens / self.decode_seconds
                                             if self.decode_seconds else None),
                **self.stats}


def check_request(session: Session, prompt, max_new_tokens: int) -> np.ndarray:
    prompt = session.check(prompt, start=0)
    if max_new_tokens < 1:
        raise SequenceError(f"max new tokens must be >= 1, got {max_new_tokens}")
    if prompt.size + max_new_tokens > session.io.max_seq_len:
        raise SequenceError(f"prompt of {prompt.size} tokens plus {max_new_tokens} new tokens "
                            f"exceeds the artifact's max length {session.io.max_seq_len}")
    return prompt


def generate(session: Session, prompt, max_new_tokens: int, sampling: Sampling = Sampling(),
             stop: Stop = Stop(), on_token: Callable[[int], None] | None = None) -> Generation:
    prompt = check_request(session, prompt, max_new_tokens)
    rng = np.random.default_rng(sampling.seed)
    session.reset()
    started = time.perf_counter()
    session.feed(prompt, last_only=True)
    result = Generation([], "max_tokens", int(prompt.size), graph_calls=1)
    result.prefill_seconds = time.perf_counter() - started
    while True:
        token = choose(session.last_logits, sampling, rng)
        if result.emit(token, on_token, stop, max_new_tokens):
            break
        started = time.perf_counter()
        session.feed([token])
        result.decode_seconds += time.perf_counter() - started
        result.graph_calls += 1
    return result
