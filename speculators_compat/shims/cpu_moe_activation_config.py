"""vLLM 0.14 on CPU: the float32 MoE path builds its activation op outside any vLLM config.

``cpu_fused_moe._CPU_MOE_ACT`` creates ``SiluAndMul`` lazily on first use, which happens inside
the model's forward, where no vLLM config is current: every float32 MoE forward fails with
``AssertionError: Current vLLM config is not set. This typically means
get_current_vllm_config() was called outside of a set_current_vllm_config() context, ...``.
vLLM 0.15 replaced the lazy ops with plain functions. The fix creates the ops up front, inside a
config context.

Probe: the lazy dict exists and builds CustomOp classes on first use.
"""

from __future__ import annotations

import importlib

from ..shim import Shim, replace_attr

NAME = "cpu_moe_activation_config"
MODULE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"


def probe() -> bool:
    from vllm.model_executor.custom_op import CustomOp

    try:
        mod = importlib.import_module(MODULE)
    except ModuleNotFoundError:  # vLLM 0.32 has no such module
        return False
    lazy = getattr(mod, "_CPU_MOE_ACT", None)
    factories = getattr(type(lazy), "_factories", {}) if lazy is not None else {}
    # Structural, not behavioural: whether building the op fails depends on whether a config
    # happens to be current, which differs between start-up (set) and forward (not set).
    return hasattr(type(lazy), "__missing__") and any(
        isinstance(f, type) and issubclass(f, CustomOp) for f in factories.values()
    )


def patch():
    from vllm.config import VllmConfig, get_current_vllm_config, set_current_vllm_config

    mod = importlib.import_module(MODULE)
    filled = type(mod._CPU_MOE_ACT)()
    try:
        config = get_current_vllm_config()
    except AssertionError:
        config = VllmConfig()
    with set_current_vllm_config(config):
        for key in type(filled)._factories:
            filled[key]  # noqa: B018 (filling the lazy dict is the point)
    return replace_attr(mod, "_CPU_MOE_ACT", filled, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{MODULE}:_CPU_MOE_ACT",
    vllm=">=0.14,<0.15",
    platform="vllm-cpu",
    symptom=(
        "AssertionError: Current vLLM config is not set. This typically means "
        "get_current_vllm_config() was called outside of a set_current_vllm_config() context"
    ),
    upstream="none found; vLLM 0.15 replaced the lazy ops",
    remove_when="vLLM 0.15 (the shim's range ends at 0.14)",
    hook_module=MODULE,
    probe=probe,
    patch=patch,
    serving=True,  # vLLM's own float32 MoE forward fails the same way
)
