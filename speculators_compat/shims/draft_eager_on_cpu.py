"""CPU: run the draft's forward eagerly instead of through ``torch.compile``.

speculators 0.3.0 decorates ``Eagle3DraftModel.forward`` with ``@torch.compile``. On CPU,
inductor fails while lowering the draft's training graph (flex attention with a block mask):
``torch._inductor.exc.InductorError: IndexError: tuple index out of range`` at the first step
(torch 2.8-2.10 CPU). The shim puts the undecorated forward back on CPU-only machines; the
eager flex-attention path computes the same attention. GPUs keep the compiled forward.

Probe: CUDA is not available and the forward is a ``torch.compile`` wrapper.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import DRAFT, module

NAME = "draft_eager_on_cpu"


def _compiled_forward():
    forward = module(DRAFT).Eagle3DraftModel.__dict__.get("forward")
    return forward if hasattr(forward, "_torchdynamo_orig_callable") else None


def probe() -> bool:
    import torch

    return not torch.cuda.is_available() and _compiled_forward() is not None


def patch():
    cls = module(DRAFT).Eagle3DraftModel
    eager = _compiled_forward()._torchdynamo_orig_callable

    def forward(self, *args, **kwargs):
        return eager(self, *args, **kwargs)

    forward.__qualname__ = f"{cls.__name__}.forward"
    forward.__doc__ = eager.__doc__
    return replace_attr(cls, "forward", forward, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{DRAFT}:Eagle3DraftModel.forward",
    vllm=">=0.11",
    symptom="torch._inductor.exc.InductorError: IndexError: tuple index out of range (first training "
    "step on CPU)",
    upstream="none filed: speculators trains on GPUs",
    remove_when="never on speculators 0.3.x (training on a CPU is ours)",
    hook_module=DRAFT,
    probe=probe,
    patch=patch,
    platform="cpu",
)
