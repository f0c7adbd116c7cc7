"""Load a trained EAGLE-3 draft with speculators' own ``from_pretrained``.

speculators 0.3.0's ``SpeculatorModel.from_pretrained`` forwards ``verifier=`` and
``verifier_attachment_mode=`` to transformers, which passes them on to the model's constructor;
``Eagle3DraftModel.__init__(config, t2d, d2t)`` does not take them, so no saved draft loads:
``TypeError: Eagle3DraftModel.__init__() got an unexpected keyword argument 'verifier'``.

With that fixed, transformers builds the model with its parameters on the ``meta`` device, and
the constructor's own copy of the verifier's LM head fails: ``RuntimeError: Attempted to call
`variable.set_data(tensor)`, but `variable` and `tensor` have incompatible tensor type``.

And then transformers ties the LM head (draft vocabulary) to the embedding (verifier vocabulary),
as ``tie_word_embeddings`` defaults to true: ``size mismatch for weight: copying a param with
shape torch.Size([32000, H]) from checkpoint, the shape in current model is torch.Size([V, H])``.

The shim lets the constructor accept the two keywords, builds the draft's parameters on the
CPU (transformers then loads the saved weights into them), unties the two, and keeps
transformers from re-initialising ``verifier_lm_head`` (not saved, read from the verifier) at
random. The draft always attaches in
``train_only`` mode (only the verifier's embeddings and LM head, read from the checkpoint its
config names), which is what it does when built for training; a verifier passed explicitly is
ignored with a warning rather than silently.

Probe: ``Eagle3DraftModel.__init__`` has no ``verifier`` parameter.
"""

from __future__ import annotations

import functools
import logging

from ..shim import Shim, replace_attr
from ._targets import DRAFT, accepts, inherited, module

NAME = "draft_from_pretrained"
log = logging.getLogger("speculators_compat")


def probe() -> bool:
    return not accepts(module(DRAFT).Eagle3DraftModel.__init__, "verifier")


def patch():
    import torch

    cls = module(DRAFT).Eagle3DraftModel
    original = inherited(cls, "__init__")
    register_parameter = torch.nn.Module.register_parameter  # torch's own, outside any context

    @functools.wraps(original)
    def __init__(self, config, *args, verifier=None, verifier_attachment_mode=None, **kwargs):
        if verifier is not None and not isinstance(verifier, str):
            log.warning(
                "Eagle3DraftModel attaches its verifier from config (train_only); the verifier passed "
                "to from_pretrained is not used"
            )
        # Real tensors, also inside transformers' empty-weights context of from_pretrained
        # (which swaps nn.Module.register_parameter for one that moves parameters to meta).
        # The draft's LM head (draft vocabulary) can never share the verifier-vocabulary
        # embedding's weight; transformers ties them when the config says so (its default).
        config.tie_word_embeddings = False
        swapped = torch.nn.Module.register_parameter
        torch.nn.Module.register_parameter = register_parameter
        try:
            original(self, config, *args, **kwargs)
        finally:
            torch.nn.Module.register_parameter = swapped
        # Not in the checkpoint (speculators does not save it) but read from the verifier just
        # now: transformers must not re-initialise it as a "missing" weight.
        self.verifier_lm_head._is_hf_initialized = True

    return replace_attr(cls, "__init__", __init__, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{DRAFT}:Eagle3DraftModel.__init__",
    vllm=">=0.11",
    symptom="TypeError: Eagle3DraftModel.__init__() got an unexpected keyword argument 'verifier'",
    upstream="speculators PR #669 (the verifier keyword leaking into the constructors)",
    remove_when="speculators 0.7.0",
    hook_module=DRAFT,
    probe=probe,
    patch=patch,
)
