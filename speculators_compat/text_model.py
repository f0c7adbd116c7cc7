"""Where a checkpoint's text model is: the one rule for multimodal wrappers.

A wrapper (Kimi-K2.5's ``KimiK25ForConditionalGeneration``) holds its language model's config in
``text_config`` and has no decoder sizes of its own; its weights sit under ``language_model.``.
A config that has both ``text_config`` and top-level decoder sizes is read at the top level,
everywhere: extraction, the transformers oracle, preflight, the draft's verifier and training
size the same model.

Works on ``config.json`` read as a dict and on transformers config objects alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Where a wrapper's text-model weights sit in its checkpoint.
WEIGHTS_PREFIX = "language_model."


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def is_wrapper(config: Any) -> bool:
    """``config`` (a dict or a transformers config) wraps its text model in ``text_config``."""
    inner = _get(config, "text_config")
    if inner is None or (isinstance(config, dict) and not isinstance(inner, dict)):
        return False
    return _get(config, "num_hidden_layers") is None


def text_config(config: Any) -> Any:
    """The text model's config: a wrapper's ``text_config``, else ``config`` itself."""
    return _get(config, "text_config") if is_wrapper(config) else config


def read_config(model_dir: str | Path) -> dict:
    """A checkpoint folder's ``config.json`` as a dict."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def read_text_config(model: str | Path) -> dict:
    """The text model's config of ``model``: a checkpoint folder, or a hub id (read as vLLM will
    read it, through transformers)."""
    if (Path(model) / "config.json").is_file():
        return text_config(read_config(model))
    from transformers import AutoConfig  # a hub id only: transformers is heavy to import

    return text_config(AutoConfig.from_pretrained(str(model), trust_remote_code=True).to_dict())


#: Text model types vLLM builds with DeepSeek-V2/V3 attention (Kimi-K2's own name included).
DEEPSEEK_ATTENTION_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def ignored_rope_interleave(config: Any) -> str | None:
    """What to tell a user whose DeepSeek/Kimi config sets ``rope_interleave: false``, or None.

    vLLM builds DeepSeek attention's rotary embedding with ``is_neox_style=False`` (pairs of
    adjacent dimensions) whatever the config says; transformers' DeepSeek-V3 honours
    ``rope_interleave`` and rotates halves when it is false. Such a model computes differently in
    vLLM than in transformers (and than where it was trained)."""
    text = text_config(config)
    if _get(text, "model_type") not in DEEPSEEK_ATTENTION_TYPES or _get(text, "rope_interleave") is not False:
        return None
    return (
        "the config sets rope_interleave: false, which vLLM ignores for DeepSeek/Kimi attention "
        "(it always rotates interleaved pairs, transformers rotates halves): vLLM's hidden states, "
        "and the draft trained on them, will not match this model as transformers computes it. "
        "Check which rotation the model was trained with before extracting."
    )
