"""CPU: resume single-process training without CUDA.

speculators 0.3.0's ``SingleGPUCheckpointer`` loads a checkpoint's weights and optimizer state
onto ``"cuda:0"`` (hard-coded), so resuming training on a machine without CUDA fails. The shim
binds the checkpointer module's ``load_safetensors_state_dict`` and ``torch`` to thin stand-ins
that load onto the CPU when the requested device is a CUDA device and CUDA is not available;
everything else is speculators' own code and torch itself.

Probe: CUDA is not available and the checkpointer names ``cuda:0``.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, ShimProxy, replace_attr, undo_all
from ._targets import CHECKPOINTER, module

NAME = "checkpointer_cpu"


def probe() -> bool:
    import torch

    source = inspect.getsource(module(CHECKPOINTER).SingleGPUCheckpointer)
    return not torch.cuda.is_available() and '"cuda:0"' in source


def _cpu_if_cuda(device):
    return "cpu" if device is not None and str(device).startswith("cuda") else device


class _TorchLoadOnCpu(ShimProxy):
    """speculators' checkpointer module's ``torch``, whose ``load`` maps CUDA to the CPU."""

    def load(self, *args, map_location=None, **kwargs):
        return self.__wrapped__.load(*args, map_location=_cpu_if_cuda(map_location), **kwargs)


def patch():
    ckpt = module(CHECKPOINTER)
    original = ckpt.load_safetensors_state_dict

    def load_safetensors_state_dict(path, device):
        return original(path, _cpu_if_cuda(device))

    return undo_all(
        [
            replace_attr(ckpt, "load_safetensors_state_dict", load_safetensors_state_dict, NAME),
            replace_attr(ckpt, "torch", _TorchLoadOnCpu(ckpt.torch), NAME),
        ]
    )


SHIM = Shim(
    name=NAME,
    target=f"{CHECKPOINTER}:load_safetensors_state_dict, {CHECKPOINTER}:torch.load",
    vllm=">=0.11",
    symptom="resuming training on CPU: RuntimeError: Found no NVIDIA driver on your system",
    upstream="none filed: speculators trains on GPUs",
    remove_when="never on speculators 0.3.x (training on a CPU is ours)",
    hook_module=CHECKPOINTER,
    probe=probe,
    patch=patch,
    platform="cpu",
)
