"""Closed forms of the paper (numpy only): the critical coupling and the shear's transfer function.

- `gamma_c(d_k, T)`: the two-branch law of the reduced Gaussian score model,
      gamma_c^2 = 2L / (sqrt(d_k) + sqrt(d_k - 8L))   for d_k >= 8L,
      gamma_c^2 = 1 / (2 c^2 sqrt(2L))                 otherwise,
  with L = log(T - 1) and c = 0.74; the branches cross over at d_k* = 8L.
- `transfer(omega, gamma)`: the shear as a causal filter on a stream,
  H(omega) = 1 + gamma (1 - e^{-i omega}); DC gain 1, gain 1 + 2 gamma at Nyquist.
- `measured_response(inp, out)`: the gain measured between two streams, to set beside it.
"""

from __future__ import annotations

import numpy as np

C = 0.74  # the paper's fitted constant of the small-d_k branch


def log_context(T: int) -> float:
    if T < 3:
        raise ValueError(f"context length T must be >= 3, got {T}")
    return float(np.log(T - 1))


def crossover_dk(T: int) -> float:
    """d_k* = 8L, where the two branches of gamma_c meet."""
    return 8 * log_context(T)


def gamma_c(d_k: float, T: int) -> float:
    L = log_context(T)
    if d_k >= 8 * L:
        return float(np.sqrt(2 * L / (np.sqrt(d_k) + np.sqrt(d_k - 8 * L))))
    return float(np.sqrt(1 / (2 * C**2 * np.sqrt(2 * L))))


def transfer(omega, gamma: float):
    omega = np.asarray(omega, dtype=float)
    return 1 + gamma * (1 - np.exp(-1j * omega))


def measured_response(inp: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gain H(omega) = <conj(X) Y> / <|X|^2> from input to output streams (one per row), a
    Welch-style cross-spectral estimate under a Hann window."""
    window = np.hanning(inp.shape[1])
    X = np.fft.rfft((inp - inp.mean(1, keepdims=True)) * window, axis=1)
    Y = np.fft.rfft((out - out.mean(1, keepdims=True)) * window, axis=1)
    omega = np.linspace(0, np.pi, X.shape[1])
    return omega, (np.conj(X) * Y).mean(0) / (np.abs(X) ** 2).mean(0)
