"""Closed forms of the paper (numpy only): the critical coupling and the shear's transfer function.

- `gamma_c(d_k, T)`: the two-branch law of the reduced Gaussian score model,
      gamma_c^2 = 2L / (sqrt(d_k) + sqrt(d_k - 8L))   for d_k >= 8L,
      gamma_c^2 = 1 / (2 c^2 sqrt(2L))                 otherwise,
  with L = log(T - 1) and c = 0.74; the branches cross over at d_k* = 8L.
- `transfer(omega, gamma)`: the shear as a causal filter on a stream,
  H(omega) = 1 + gamma (1 - e^{-i omega}); DC gain 1, gain 1 + 2 gamma at Nyquist.
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
