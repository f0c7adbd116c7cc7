"""Training targets from the verifier's real logits: apply its final norm first.

speculators 0.3.0's data loader takes the last captured layer as
``verifier_last_hidden_states`` and the draft computes its targets as
``verifier_lm_head(verifier_last_hidden_states)``. A decoder layer's output is the residual
stream *before* the model's final RMSNorm, so those targets are not the verifier's logits: the
draft is trained towards a distribution the verifier never produces: on the tiny DeepSeek-V3
the "targets" differ from the real logits by a relative error of 0.96 (the KL loss fits a
softmax whose temperature is each position's RMS; the argmax survives only where the norm's
weight is uniform, as in that random model).

The shim loads the verifier's final norm weight (``model.norm.weight``, under a wrapper's prefix
when ``draft_verifier_wrapper`` is applied) and its epsilon into the draft as a non-persistent
buffer, and normalises the input of ``verifier_lm_head`` with it. Nothing is added to the saved
draft (the buffer is not persistent and ``verifier_lm_head`` is not saved), so checkpoints are
the same files speculators writes. ``extract`` records in ``data_config.json`` that targets are
computed this way, and that the last layer id must be the verifier's last layer.

Probe: the draft's forward feeds ``verifier_last_hidden_states`` straight to ``verifier_lm_head``.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ..text_model import text_config
from ._targets import DRAFT, inherited, module

NAME = "training_target_final_norm"
BUFFER = "_compat_verifier_norm_weight"


def probe() -> bool:
    source = inspect.getsource(inspect.unwrap(module(DRAFT).Eagle3DraftModel.forward))
    return "self.verifier_lm_head(verifier_last_hidden_states)" in source


def _normalise_input(module_, args):
    import torch

    (hidden,) = args
    weight = getattr(module_, BUFFER)
    normed = torch.nn.functional.rms_norm(
        hidden.float(), (hidden.shape[-1],), weight.float(), module_._compat_verifier_norm_eps
    )
    return (normed.to(hidden.dtype),)


def patch():
    draft = module(DRAFT)
    cls = draft.Eagle3DraftModel
    original = inherited(cls, "_setup_embeddings_and_lm_heads")

    def _setup_embeddings_and_lm_heads(self, config, t2d):
        original(self, config, t2d)
        path = config.name_or_path
        weights = draft.load_model_layers(["model.norm.weight"], path)
        if "model.norm.weight" not in weights:
            raise ValueError(
                f"speculators_compat ({NAME}): the verifier checkpoint {path} has no final norm "
                "'model.norm.weight'; training targets cannot be the verifier's logits. Disable "
                f"the shim (SPECULATORS_COMPAT_DISABLE={NAME}) to train on the un-normalised states."
            )
        verifier = draft.AutoConfig.from_pretrained(path)
        verifier = text_config(verifier)
        head = self.verifier_lm_head
        head.register_buffer(BUFFER, weights["model.norm.weight"].to(head.weight.dtype), persistent=False)
        head._compat_verifier_norm_eps = float(verifier.rms_norm_eps)
        head.register_forward_pre_hook(_normalise_input)

    _setup_embeddings_and_lm_heads.__qualname__ = f"{cls.__name__}._setup_embeddings_and_lm_heads"
    return replace_attr(cls, "_setup_embeddings_and_lm_heads", _setup_embeddings_and_lm_heads, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{DRAFT}:Eagle3DraftModel._setup_embeddings_and_lm_heads",
    vllm=">=0.11",
    symptom="no error: the draft is trained towards lm_head(last layer) without the verifier's final "
    "norm, not towards the verifier's logits",
    upstream="speculators PR #313 (the norm before the LM head)",
    remove_when="speculators 0.4.0",
    hook_module=DRAFT,
    probe=probe,
    patch=patch,
)
