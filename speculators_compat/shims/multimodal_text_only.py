"""Multimodal targets (Kimi-K2.5): extract from the text model only, without the vision tower.

``KimiK25ForConditionalGeneration`` wraps a DeepSeek-V3 text model with a MoonViT vision tower
and projector. Hidden-state extraction feeds text only, yet speculators 0.3.0's ``ModelConfig``
leaves every media input enabled: vLLM builds and profiles the vision tower (memory, start-up,
and the checkpoint's vision weights must load). The shim sets every media limit to 0, which
vLLM (>= 0.12 ``_mark_tower_model``) turns into "skip the tower". Plain text models are left
exactly as they were.

Probe: ``ModelConfig`` takes ``limit_mm_per_prompt``.
"""

from __future__ import annotations

from ..settings import MODALITIES
from ..shim import Shim, replace_attr
from ._targets import GENERATOR, GENERATOR_REPLACED, accepts, module

NAME = "multimodal_text_only"


def probe() -> bool:
    return accepts(module(GENERATOR).ModelConfig, "limit_mm_per_prompt")


def patch():
    gen = module(GENERATOR)
    original = gen.ModelConfig

    def ModelConfig(*args, **kwargs):  # noqa: N802 (stands in for the class)
        config = original(*args, **kwargs)
        if config.is_multimodal_model and "limit_mm_per_prompt" not in kwargs:
            kwargs["limit_mm_per_prompt"] = {m: 0 for m in MODALITIES}
            config = original(*args, **kwargs)
        return config

    return replace_attr(gen, "ModelConfig", ModelConfig, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:ModelConfig",
    vllm=">=0.11",
    symptom="Exception: WorkerProc initialization failed due to an exception in a background "
    "process (the vision tower's weights are missing from a text-only checkpoint); with them, a "
    "vision tower built, loaded and profiled for nothing",
    upstream="none found",
    remove_when=GENERATOR_REPLACED,
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
