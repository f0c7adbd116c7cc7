"""The reference oracle: each decoder layer's output, computed by transformers in float32.

speculators 0.3.0's convention for "layer i's hidden state" is the layer's **output**: the
residual stream after layer i (``hidden_states + residual`` in vLLM's fused-norm layers), before
the final norm. Here a forward hook on every decoder layer of the transformers model records
exactly that, so the oracle never re-implements the model.

Multimodal wrappers (a checkpoint whose config has a ``text_config`` and whose weights sit under
``language_model.``) are reduced to their text model: the weights are loaded with the prefix
stripped into the transformers class of ``text_config``.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import torch

from ..text_model import WEIGHTS_PREFIX, is_wrapper, read_config, text_config

__all__ = ["SHARP_TOLERANCE", "TOLERANCE", "ReferenceModel", "relative_error", "tolerance"]

#: Largest relative error (see :func:`relative_error`) accepted between vLLM's layer outputs and
#: this oracle, per checkpoint dtype. Measured on the tiny fixtures (CPU): float32 0 (vLLM 0.16)
#: to 1.1e-3 (0.11); bfloat16 4e-3 to 1.2e-2 (0.16) and up to 3.2e-2 (0.11). A state taken from
#: the wrong layer or sequence is off by more than 0.5. The bounds leave room above the
#: measurements and stay far below a wrong answer.
TOLERANCE = {"float32": 5e-3, "bfloat16": 5e-2, "float16": 5e-2}
#: The same in float32 on weights whose attention depends on positions (the fixtures a recipe
#: ``sharpen``s, a trained model): measured 1.7e-6 at most (vLLM 0.16, 0.22, 0.32; MLA on and
#: off). Random weights attend uniformly, so their bound has to leave room for what a wrong
#: rotation does to them (0.009); on sharp weights a wrong rotary embedding is off by 0.8-1.1.
#: Not where vLLM computes through intel_extension_for_pytorch (its 0.11 CPU build): those
#: float32 kernels are less exact, 1.2e-3 to 1.6e-3 on the same weights, and keep ``TOLERANCE``.
SHARP_TOLERANCE = 1e-4


def _ipex_installed() -> bool:
    """vLLM's CPU build runs its kernels through intel_extension_for_pytorch (0.11 depends on it)."""
    return importlib.util.find_spec("intel_extension_for_pytorch") is not None


def tolerance(dtype: str, sharp: bool = False) -> float:
    """The bound for a comparison in ``dtype``; ``sharp``: on weights where positions matter."""
    if sharp and dtype == "float32" and not _ipex_installed():
        return SHARP_TOLERANCE
    return TOLERANCE[dtype]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|: one number per compared tensor."""
    actual = actual.detach().float().cpu()
    expected = expected.detach().float().cpu()
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    scale = expected.abs().max().clamp_min(1e-12)
    return float((actual - expected).abs().max() / scale)


def is_multimodal_wrapper(model_dir: str | Path) -> bool:
    """A checkpoint whose text model sits under a wrapper (:mod:`speculators_compat.text_model`)."""
    return is_wrapper(read_config(model_dir))


class ReferenceModel:
    """A checkpoint loaded in transformers (float32, CPU) that returns per-layer outputs."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        if is_multimodal_wrapper(self.model_dir):
            raw = json.loads((self.model_dir / "config.json").read_text())
            self.model = _load_text_model_of_wrapper(self.model_dir, raw)
        else:
            config = AutoConfig.from_pretrained(self.model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, config=config, dtype=torch.float32
            )
        self.model.eval()
        self.layers = self.model.model.layers
        self.num_layers = len(self.layers)

    @torch.no_grad()
    def layer_outputs(self, token_ids: list[int]) -> torch.Tensor:
        """Outputs of every decoder layer for one sequence: shape [num_layers, seq_len, hidden]."""
        captured: list[torch.Tensor] = []

        def hook(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            captured.append(out[0].detach().clone())

        handles = [layer.register_forward_hook(hook) for layer in self.layers]
        try:
            ids = torch.as_tensor([token_ids], dtype=torch.long)
            self.model(input_ids=ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        if len(captured) != self.num_layers:
            raise RuntimeError(f"captured {len(captured)} layer outputs, expected {self.num_layers}")
        return torch.stack(captured)

    @torch.no_grad()
    def entering_states(self, token_ids: list[int]) -> torch.Tensor:
        """The state entering every decoder layer (transformers' ``output_hidden_states[k]``,
        k < num_layers; index 0 is the embedding): shape [num_layers, seq_len, hidden]. This is
        vLLM's convention for ``eagle_aux_hidden_state_layer_ids``."""
        ids = torch.as_tensor([token_ids], dtype=torch.long)
        out = self.model(input_ids=ids, use_cache=False, output_hidden_states=True)
        return torch.stack([h[0] for h in out.hidden_states[: self.num_layers]])

    @torch.no_grad()
    def next_token(self, token_ids: list[int]) -> tuple[int, float]:
        """Greedy next token after ``token_ids`` and its logit margin over the runner-up."""
        ids = torch.as_tensor([token_ids], dtype=torch.long)
        logits = self.model(input_ids=ids, use_cache=False).logits[0, -1].float()
        top = torch.topk(logits, 2)
        return int(top.indices[0]), float(top.values[0] - top.values[1])


_TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}


def _load_text_model_of_wrapper(model_dir: Path, raw: dict):
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    text = dict(text_config(raw))
    model_type = text.pop("model_type")
    # Kimi-K2's text model type is a DeepSeek-V3 under another name (remote code upstream).
    config = AutoConfig.for_model(_TEXT_MODEL_TYPES.get(model_type, model_type), **text)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        for key, value in load_file(str(shard)).items():
            if key.startswith(WEIGHTS_PREFIX):
                state[key.removeprefix(WEIGHTS_PREFIX)] = value.float()
    # Through from_pretrained, on a folder holding the text model alone: transformers converts the
    # checkpoint layout (one tensor per expert) to its own (transformers 5 fuses the experts).
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        save_file(state, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        model, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    if missing or unexpected:
        raise RuntimeError(
            f"{model_dir}: text weights under 'language_model.' do not fit {config.architectures}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model
