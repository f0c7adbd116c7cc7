"""Let the caller choose the generator's dtype (:func:`speculators_compat.settings.extraction_dtype`,
``SPECULATORS_COMPAT_DTYPE``).

speculators 0.3.0 hard-codes ``ModelConfig(dtype="auto")``, and vLLM's "auto" runs a float32
checkpoint in half precision (bfloat16 on CPU). That is right for production, but a float32
reference comparison then differs by about 1e-2 instead of about 1e-6, and a user cannot ask
for float32 extraction at all. Inside ``with extraction_dtype("float32"):`` (what ``extract
--dtype`` and ``smoke`` use), or with ``SPECULATORS_COMPAT_DTYPE=float32`` exported (or
``bfloat16``, ``float16``), the shim passes that dtype instead; otherwise nothing changes.

Probe: speculators' ``_create_vllm_config`` hard-codes ``dtype="auto"``. (The choice is read at
each call, so it may be made after import.)
"""

from __future__ import annotations

import inspect

from ..settings import chosen_dtype
from ..shim import Shim
from ._targets import GENERATOR, GENERATOR_REPLACED, module, rewrite_call

NAME = "generator_dtype"


def probe() -> bool:
    source = inspect.getsource(module(GENERATOR).VllmHiddenStatesGenerator._create_vllm_config)
    return 'dtype="auto"' in source


def _choose_dtype(_args: tuple, kwargs: dict) -> None:
    dtype = chosen_dtype()
    if dtype == "auto":
        dtype = None
    if dtype and kwargs.get("dtype", "auto") == "auto":
        kwargs["dtype"] = dtype


def patch():
    return rewrite_call("ModelConfig", NAME, _choose_dtype)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:ModelConfig",
    vllm=">=0.11",
    symptom="no error: a float32 checkpoint is extracted in bfloat16/float16 (vLLM's dtype='auto'), "
    "about 1e-2 away from the model's float32 computation",
    upstream="none found (speculators 0.3.0's generator has no dtype setting)",
    remove_when=GENERATOR_REPLACED,
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
