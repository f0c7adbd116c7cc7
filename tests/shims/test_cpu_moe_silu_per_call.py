"""cpu_moe_silu_per_call: vLLM 0.20-0.24's CPU MoE builds a CustomOp per call, outside a config.

The activation entry is called as ``cpu_fused_moe_torch`` calls it inside the model's forward
(no vLLM config current), in a fresh process with and without the shim; the patched entry must
compute SiLU-and-mul exactly.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from speculators_compat.shims.cpu_moe_silu_per_call import MODULE, SHIM
from tests.helpers import run_python

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")

_CALL = """
    import json, torch
    import speculators_compat
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe as m
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    expected = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    key = next(k for k in m._CPU_MOE_ACT_FN if "silu" in str(k).lower())
    try:
        out = m._CPU_MOE_ACT_FN[key](x)
        print(json.dumps({"ok": True, "error": float((out - expected).abs().max())}))
    except AssertionError as exc:
        print(json.dumps({"ok": False, "message": str(exc)}))
"""


def test_float32_moe_activation_outside_a_config(claimed):
    if importlib.util.find_spec(MODULE) is None:
        pytest.skip(f"this vLLM has no {MODULE} (the probe says not needed)")
    module = importlib.import_module(MODULE)
    if not hasattr(module, "_CPU_MOE_ACT_FN"):
        pytest.skip(f"this vLLM's {MODULE} has no _CPU_MOE_ACT_FN (the drift's table; 0.20-0.24)")
    patched = run_python(_CALL)
    unpatched = run_python(_CALL, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    assert patched["ok"] and patched["error"] == 0.0, patched
    if claimed(SHIM):
        assert not unpatched["ok"], unpatched
        assert "Current vLLM config is not set" in unpatched["message"]
        assert "Current vLLM config is not set" in SHIM.symptom
    else:
        assert unpatched["ok"], unpatched
