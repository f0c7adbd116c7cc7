"""transformers 5 (which vLLM >= 0.24 requires): ``import speculators`` fails in pydantic.

transformers 5's ``PretrainedConfig`` annotates ``dtype: "str | torch.dtype | None"`` while its
module imports torch only for type checkers. speculators 0.3.0's pydantic models hold a
``PretrainedConfig``; pydantic resolves that annotation in the module's globals and finds no
``torch``. The shim puts ``torch`` into ``transformers.configuration_utils``' globals.

Probe: a ``PretrainedConfig`` annotation names ``torch.`` and the module has no global ``torch``.
Hooked on transformers, so ``import speculators_compat`` must come before ``import speculators``
(the CLI and the vLLM plugin do this).
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import module

NAME = "config_dtype_annotation"
HOOK = "transformers.configuration_utils"


def probe() -> bool:
    mod = module(HOOK)
    annotations = getattr(mod.PretrainedConfig, "__annotations__", {})
    names_torch = any("torch." in str(a) for a in annotations.values())
    return names_torch and "torch" not in vars(mod)


def patch():
    import torch

    mod = module(HOOK)
    mod.torch = torch

    def undo() -> None:
        vars(mod).pop("torch", None)

    return undo


SHIM = Shim(
    name=NAME,
    target=f"{HOOK}:torch",
    vllm=">=0.11",
    transformers=">=5",
    symptom="pydantic.errors.PydanticUndefinedAnnotation: name 'torch' is not defined "
    "(at import speculators, with transformers 5)",
    upstream="none found",
    remove_when="speculators 0.5.0 (supports transformers 5: transformers>=4.56.1,<5.7.0)",
    hook_module=HOOK,
    probe=probe,
    patch=patch,
)
