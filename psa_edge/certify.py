"""Executable certificates of the paper's operator-level claims (`psa-edge certify`).

Contract: each certificate is a function returning a `Certificate` (name, claim, residual,
tolerance, passed). The operator under test is a parameter (`shear_op`, default the real
`ops.shear`), so a test can hand in a wrong operator and watch the certificate fail. Residuals
are measured in float64 on seeded random streams; nothing is asserted that is not computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from psa_edge import theory
from psa_edge.model.ops import apply_rope, rope_cos_sin, rope_inv_freq, shear

ShearOp = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
GAMMA = 0.8
TOL = 1e-10


@dataclass(frozen=True)
class Certificate:
    name: str
    claim: str
    residual: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return bool(self.residual <= self.tolerance)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def streams(seq_len=16, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 1, seq_len, dim, generator=g, dtype=torch.float64),
            torch.randn(1, 1, seq_len, dim, generator=g, dtype=torch.float64))


def zeros_like_slot(x):
    return torch.zeros_like(x[..., :1, :])


def momentum(x):
    """p_t = x_t - x_{t-1} with x_{-1} = 0: the operator-independent definition."""
    return x - torch.cat([zeros_like_slot(x), x[..., :-1, :]], dim=-2)


def four_term(shear_op: ShearOp = shear) -> Certificate:
    q, k = streams()
    z = zeros_like_slot(q)
    gq, gk = 0.3, GAMMA
    lhs = shear_op(q, z, gq) @ shear_op(k, z, gk).transpose(-1, -2)
    pq, pk = momentum(q), momentum(k)
    t = lambda a, b: a @ b.transpose(-1, -2)  # noqa: E731
    rhs = t(q, k) + gq * t(pq, k) + gk * t(q, pk) + gq * gk * t(pq, pk)
    return Certificate("four-term decomposition",
                       "q^.k^ = q.k + gq p_q.k + gk q.p_k + gq gk p_q.p_k",
                       float((lhs - rhs).abs().max()), TOL)


def upper_shear(shear_op: ShearOp = shear) -> Certificate:
    """The map (q, p) -> (q + gamma p, p), unit determinant, symplectic, |p|^2 kept."""
    x, _ = streams()
    sheared = shear_op(x, zeros_like_slot(x), GAMMA)
    as_map = float((sheared - (x + GAMMA * momentum(x))).abs().max())
    d = 4
    eye, zero = np.eye(d), np.zeros((d, d))
    M = np.block([[eye, GAMMA * eye], [zero, eye]])
    J = np.block([[zero, eye], [-eye, zero]])
    qp = np.random.default_rng(0).normal(size=2 * d)
    energy = abs(np.sum((M @ qp)[d:] ** 2) - np.sum(qp[d:] ** 2))
    residual = max(as_map, abs(np.linalg.det(M) - 1), float(np.abs(M.T @ J @ M - J).max()),
                   float(energy))
    return Certificate("upper shear, symplectic", "(q,p) -> (q + g p, p); det 1; M^T J M = J; "
                       "|p|^2 preserved", residual, TOL)


def hamiltonian_flow(shear_op: ShearOp = shear) -> Certificate:
    """Integrate Hamilton's equations of H = |p|^2 / 2 (vector field by autograd) with RK4 from
    (q, p) = (x, momentum(x)) to time gamma, and compare q with the operator's output."""
    x, _ = streams()

    def field(q, p):
        q, p = q.detach().requires_grad_(), p.detach().requires_grad_()
        dh_dq, dh_dp = torch.autograd.grad(0.5 * (p * p).sum() + 0.0 * q.sum(), (q, p))
        return dh_dp, -dh_dq

    q, p = x.clone(), momentum(x)
    h = GAMMA / 32
    for _ in range(32):
        a = field(q, p)
        b = field(q + h / 2 * a[0], p + h / 2 * a[1])
        c = field(q + h / 2 * b[0], p + h / 2 * b[1])
        e = field(q + h * c[0], p + h * c[1])
        q = q + h / 6 * (a[0] + 2 * b[0] + 2 * c[0] + e[0])
        p = p + h / 6 * (a[1] + 2 * b[1] + 2 * c[1] + e[1])
    sheared = shear_op(x, zeros_like_slot(x), GAMMA)
    return Certificate("exact gamma-flow of H=|p|^2/2", "M_gamma equals the time-gamma "
                       "Hamiltonian flow (RK4)", float((sheared - q).abs().max()), 1e-9)


def dc_neutral(shear_op: ShearOp = shear) -> Certificate:
    const = torch.ones(1, 1, 12, 8, dtype=torch.float64) * 3.0
    out = shear_op(const, const[..., :1, :], GAMMA)  # a stream that was constant before too
    return Certificate("DC neutrality", "a constant stream has zero momentum: x^ = x",
                       float((out - const).abs().max()), TOL)


def high_pass(shear_op: ShearOp = shear) -> Certificate:
    """Measured gain of the operator on sinusoids against |H(omega)|, and |H| rising 1 -> 1+2g."""
    n = 512
    t = torch.arange(n, dtype=torch.float64)
    residual = 0.0
    omegas = np.linspace(0.05, np.pi - 0.05, 24)
    for w in omegas:
        x = torch.cos(w * t)[None, None, :, None]
        prev = torch.cos(w * torch.tensor([-1.0], dtype=torch.float64))[None, None, :, None]
        y = shear_op(x, prev, GAMMA)[0, 0, :, 0].numpy()
        H = theory.transfer(w, GAMMA)
        expected = np.abs(H) * np.cos(w * t.numpy() + np.angle(H))
        residual = max(residual, float(np.abs(y - expected).max()))
    gains = np.abs(theory.transfer(np.linspace(0, np.pi, 100), GAMMA))
    shape = max(abs(gains[0] - 1), abs(gains[-1] - (1 + 2 * GAMMA)),
                float(max(0.0, -np.diff(gains).min())))
    return Certificate("high-pass response", "gain |1 + g(1 - e^-iw)|: 1 at DC, 1+2g at Nyquist",
                       max(residual, shape), 1e-9)


def placement(shear_op: ShearOp = shear) -> Certificate:
    """post - pre = g (R_t - R_{t-1}) k_{t-1}: the rotation-dependent Coriolis term, non-zero."""
    _, k = streams(dim=16)
    cos, sin = rope_cos_sin(torch.arange(16), rope_inv_freq(16, 10000.0).double())
    rot = lambda x, c, s: apply_rope(x, c, s)  # noqa: E731
    z = zeros_like_slot(k)
    post = shear_op(rot(k, cos, sin), z, GAMMA)
    pre = rot(shear_op(k, z, GAMMA), cos, sin)
    k_prev = torch.cat([z, k[..., :-1, :]], dim=-2)
    cos_prev, sin_prev = rope_cos_sin(torch.arange(-1, 15), rope_inv_freq(16, 10000.0).double())
    coriolis = GAMMA * (rot(k_prev, cos, sin) - rot(k_prev, cos_prev, sin_prev))
    identity = float(((post - pre) - coriolis).abs().max())
    magnitude = float(coriolis[..., 1:, :].abs().max())
    # Fails if the identity breaks, or if the Coriolis term vanished (pre == post).
    return Certificate("placement corollary", f"post-RoPE - pre-RoPE = Coriolis term "
                       f"(max |term| {magnitude:.3f}, must be > 0.01)",
                       identity if magnitude > 0.01 else float("inf"), 1e-9)


def kv_cache_parity(shear_op: ShearOp = shear) -> Certificate:
    from psa_edge.model import PSATransformer, preset_config

    psa = PSATransformer(preset_config("tiny", "key-only")).eval()
    twin = PSATransformer(psa.cfg.twin()).eval()
    worst = 0.0
    slot_bytes = set()
    with torch.no_grad():
        for length in (1, 7, 33):
            ids = torch.zeros(1, length, dtype=torch.long)
            _, s_psa, _ = psa.forward_with_state(ids, psa.empty_state(1))
            _, s_twin, _ = twin.forward_with_state(ids, twin.empty_state(1))
            cache = lambda s: sum(t.numel() * t.element_size() for layer in s  # noqa: E731
                                  for n, t in layer.items() if n in ("key", "value"))
            worst = max(worst, abs(cache(s_psa) - cache(s_twin)))
            slot_bytes.add(sum(t.numel() * t.element_size() for layer in s_psa
                               for n, t in layer.items() if n.startswith("prev_")))
    return Certificate("KV-cache parity", "cache bytes PSA == twin at every length; one slot "
                       f"per layer of constant size ({sorted(slot_bytes)} bytes)",
                       worst + (len(slot_bytes) - 1), 0.0)


def flop_count(shear_op: ShearOp = shear) -> Certificate:
    """Elementwise ops of one token's shear, counted on the traced graph: 3 d."""
    d = 64
    counted = {"n": 0}

    class Counter(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in ("sub", "__sub__", "rsub", "__rsub__", "mul", "__mul__", "__rmul__",
                        "add", "__add__", "__radd__"):
                counted["n"] += out.numel()
            return out

    x, prev = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    with Counter():
        shear_op(x, prev, GAMMA)
    return Certificate("FLOPs per token", f"one sheared stream costs 3 d = {3 * d} FLOPs "
                       f"(counted {counted['n']})", float(abs(counted["n"] - 3 * d)), 0.0)


def critical_coupling(shear_op: ShearOp = shear) -> Certificate:
    value = theory.gamma_c(64, 512)
    d_star = theory.crossover_dk(512)
    return Certificate("critical coupling", f"gamma_c(d_k=64, T=512) = {value:.4f} (paper 1.030); "
                       f"crossover d_k* = 8 log(T-1) = {d_star:.2f}",
                       abs(round(value, 3) - 1.030), 0.0)


def zero_parameters(shear_op: ShearOp = shear) -> Certificate:
    from psa_edge.model import PSATransformer, count_parameters, preset_config

    counts = [count_parameters(PSATransformer(preset_config("tiny", v)))
              for v in ("baseline", "key-only", "symmetric", "query-only")]
    return Certificate("zero added parameters", f"every variant has {counts[0]} parameters",
                       float(max(counts) - min(counts)), 0.0)


CERTIFICATES = [four_term, upper_shear, hamiltonian_flow, dc_neutral, high_pass, placement,
                kv_cache_parity, flop_count, critical_coupling, zero_parameters]


def run_all(shear_op: ShearOp = shear) -> list[Certificate]:
    return [cert(shear_op) for cert in CERTIFICATES]
