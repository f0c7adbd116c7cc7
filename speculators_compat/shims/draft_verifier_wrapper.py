"""Draft training on a verifier inside a multimodal wrapper (Kimi-K2.5).

speculators 0.3.0's ``Eagle3DraftModel`` takes its embeddings and LM head from the verifier
checkpoint: it reads the verifier's config with ``AutoConfig.from_pretrained(path)`` and the
tensors ``model.embed_tokens.weight`` / ``lm_head.weight``. Kimi-K2.5 is a remote-code wrapper
(``KimiK25ForConditionalGeneration``) whose text model's config sits in ``text_config`` and whose
weights sit under ``language_model.``; the draft cannot be built.

The shim binds two names in speculators' draft module: ``AutoConfig`` to a loader that trusts the
checkpoint's remote code (as speculators' generator already does for the same checkpoint) and
returns the text model's config of a wrapper, and ``load_model_layers`` to a loader that finds
the requested tensors under the wrapper's prefix and returns them under the names asked for.
Plain checkpoints load exactly as before.

Probe: the draft module reads the verifier config without ``trust_remote_code``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from ..shim import Shim, ShimProxy, replace_attr, undo_all
from ..text_model import text_config
from ._targets import DRAFT, module

NAME = "draft_verifier_wrapper"


def probe() -> bool:
    source = inspect.getsource(module(DRAFT).Eagle3DraftModel._setup_embeddings_and_lm_heads)
    return "trust_remote_code" not in source


def checkpoint_tensor_names(model_path: str) -> list[str] | None:
    """Tensor names of a local safetensors checkpoint, or None when it is not a local folder."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    single = folder / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return list(f.keys())
    return None


def wrapper_prefix(names: list[str], wanted: str = "model.embed_tokens.weight") -> str:
    """The prefix under which a wrapper stores its text model (``""`` for a plain model)."""
    if wanted in names:
        return ""
    for name in names:
        if name.endswith("." + wanted):
            return name[: -len(wanted)]
    return ""


class _VerifierConfigLoader(ShimProxy):
    """Stands in for ``AutoConfig`` inside speculators' draft module."""

    def from_pretrained(self, path, *args, **kwargs):
        kwargs.setdefault("trust_remote_code", True)
        return text_config(self.__wrapped__.from_pretrained(path, *args, **kwargs))


def patch():
    draft = module(DRAFT)
    original_load = draft.load_model_layers

    def load_model_layers(layer_names, model_path):
        names = checkpoint_tensor_names(str(model_path))
        prefix = wrapper_prefix(names) if names else ""
        if not prefix:
            return original_load(layer_names, model_path)
        found = original_load([prefix + n for n in layer_names], model_path)
        return {name[len(prefix) :]: tensor for name, tensor in found.items()}

    return undo_all(
        [
            replace_attr(draft, "AutoConfig", _VerifierConfigLoader(draft.AutoConfig), NAME),
            replace_attr(draft, "load_model_layers", load_model_layers, NAME),
        ]
    )


SHIM = Shim(
    name=NAME,
    target=f"{DRAFT}:AutoConfig, {DRAFT}:load_model_layers",
    vllm=">=0.11",
    symptom="ValueError: The repository ... contains custom code which must be executed to correctly "
    "load the model (then: no hidden_size, and 'model.embed_tokens.weight' not found under "
    "'language_model.')",
    upstream="none found",
    remove_when="never on speculators 0.3.x (a 0.3.0 limit: the verifier's config read without its wrapper)",
    hook_module=DRAFT,
    probe=probe,
    patch=patch,
)
