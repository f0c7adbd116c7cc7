"""cpu_moe_activation_config: vLLM 0.14's CPU MoE builds CustomOps outside a config context."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims.cpu_moe_activation_config import SHIM
from tests.helpers import run_python

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")

# A float32 MoE forward outside any vLLM config, as vLLM runs the model: first use of the
# activation inside cpu_fused_moe_torch.
_FORWARD = """
    import json, torch
    import speculators_compat
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe as m
    try:
        act = m._CPU_MOE_ACT["silu"] if hasattr(m, "_CPU_MOE_ACT") else None
        out = act.forward_native(torch.ones(2, 8)) if act is not None else torch.zeros(2, 4)
        print(json.dumps({"ok": True, "shape": list(out.shape)}))
    except AssertionError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
"""


def test_unpatched_first_use_fails_with_the_symptom_and_patched_works(claimed):
    import importlib.util

    from speculators_compat.shims.cpu_moe_activation_config import MODULE

    if importlib.util.find_spec(MODULE) is None:
        pytest.skip(f"this vLLM has no {MODULE} (the probe says not needed)")
    patched = run_python(_FORWARD)
    unpatched = run_python(_FORWARD, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    assert patched["ok"], patched
    if claimed(SHIM):
        assert not unpatched["ok"]
        assert "Current vLLM config is not set" in unpatched["error"]
        assert "Current vLLM config is not set" in SHIM.symptom
    else:
        assert unpatched["ok"]
