"""cpu_rms_norm_strided: vLLM 0.12-0.13's CPU RMSNorm on strided views."""

from __future__ import annotations

import pytest
import torch

import speculators_compat
from speculators_compat.shims.cpu_rms_norm_strided import SHIM, _cpu_config_context

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")


def _strided_error() -> float:
    from vllm.model_executor.layers.layernorm import RMSNorm

    gen = torch.Generator().manual_seed(1)
    with _cpu_config_context():
        norm = RMSNorm(64, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(64, generator=gen) + 0.5)
        view = torch.randn(7, 96, generator=gen)[:, 32:]
        got = norm.forward_cpu(view)
        return float((got - norm.forward_native(view.contiguous())).abs().max())


def test_unpatched_kernel_is_wrong_on_claimed_versions_and_patched_is_right(claimed):
    speculators_compat.apply_now()
    state = {s.shim.name: s.state for s in speculators_compat.status()}[SHIM.name]
    assert state == ("applied" if claimed(SHIM) else "not needed")
    assert _strided_error() < 1e-4
    speculators_compat.unpatch()
    try:
        unpatched = _strided_error()
    finally:
        speculators_compat.apply_now()
    if claimed(SHIM):
        assert unpatched > 1.0  # the symptom: a wrong norm, silently
    else:
        assert unpatched < 1e-4
