"""Certificates of the paper's operator claims: each passes on the real operator, and the
certificates catch deliberately wrong operators."""

import json
import subprocess
import sys

import pytest
import torch

from psa_edge import theory
from psa_edge.certify import CERTIFICATES, placement, run_all


@pytest.mark.parametrize("cert", CERTIFICATES, ids=lambda c: c.__name__)
def test_certificate_passes_on_the_real_operator(cert):
    result = cert()
    assert result.passed, result


def non_causal(x, prev, gamma):
    """A forward difference x_{t+1} - x_t: sees the future."""
    ahead = torch.cat([x[..., 1:, :], x[..., -1:, :]], dim=-2)
    return x + gamma * (ahead - x)


def no_shear(x, prev, gamma):
    return x


def wrong_boundary(x, prev, gamma):
    """Repeats the first element instead of the carried-in (zero) state."""
    shifted = torch.cat([x[..., :1, :], x[..., :-1, :]], dim=-2)
    return x + gamma * (x - shifted)


@pytest.mark.parametrize("op,expected_failures", [
    (non_causal, {"four-term decomposition", "upper shear, symplectic",
                  "exact gamma-flow of H=|p|^2/2", "high-pass response"}),
    (no_shear, {"four-term decomposition", "upper shear, symplectic",
                "exact gamma-flow of H=|p|^2/2", "high-pass response", "placement corollary",
                "FLOPs per token"}),
    (wrong_boundary, {"four-term decomposition", "upper shear, symplectic",
                      "exact gamma-flow of H=|p|^2/2", "high-pass response"}),
])
def test_certificates_fail_on_wrong_operators(op, expected_failures):
    failed = {c.name for c in run_all(op) if not c.passed}
    assert expected_failures <= failed, failed


def test_placement_refuses_an_operator_that_commutes_with_rope():
    """A position-blind scaling gives the same result pre- and post-RoPE: no Coriolis term, so
    it cannot be the paper's operator and the placement certificate fails."""
    assert not placement(lambda x, prev, gamma: x * (1 + gamma)).passed


def test_gamma_c_and_transfer():
    assert round(theory.gamma_c(64, 512), 3) == 1.030
    d_star = theory.crossover_dk(512)
    assert abs(d_star - 8 * 6.23637) < 1e-3
    assert theory.gamma_c(d_star - 1e-6, 512) < theory.gamma_c(d_star, 512)  # branch switch
    assert abs(theory.transfer(0.0, 0.8) - 1) < 1e-12
    assert abs(abs(theory.transfer(3.141592653589793, 0.8)) - 2.6) < 1e-12
    with pytest.raises(ValueError):
        theory.gamma_c(64, 2)


def test_certify_cli_json():
    result = subprocess.run([sys.executable, "-m", "psa_edge.cli", "certify", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data) == 10 and all(c["passed"] for c in data)
