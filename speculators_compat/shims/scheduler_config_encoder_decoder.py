"""vLLM >= 0.12: ``SchedulerConfig`` requires ``is_encoder_decoder``.

speculators 0.3.0 builds ``SchedulerConfig(max_num_seqs=..., max_model_len=...,
max_num_batched_tokens=...)``. From vLLM 0.12 ``is_encoder_decoder`` is a required init-only
field and pydantic refuses the call. EAGLE-3 targets are decoder-only, so the shim passes
``is_encoder_decoder=False`` when the caller did not say.

Probe: ``is_encoder_decoder`` is a parameter of ``SchedulerConfig`` without a default.
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import GENERATOR, module, requires, rewrite_call

NAME = "scheduler_config_encoder_decoder"


def probe() -> bool:
    return requires(module(GENERATOR).SchedulerConfig, "is_encoder_decoder")


def patch():
    return rewrite_call("SchedulerConfig", NAME, lambda _args, kw: kw.setdefault("is_encoder_decoder", False))


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:SchedulerConfig",
    vllm=">=0.12",
    symptom="pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig "
    "is_encoder_decoder Field required",
    upstream="speculators PR #225 (vLLM 0.12)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
