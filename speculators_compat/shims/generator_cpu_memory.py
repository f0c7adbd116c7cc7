"""CPU backend: the generator sizes its KV cache with ``torch.cuda.mem_get_info()``.

On a machine without CUDA (vLLM's CPU backend, as in this project's tests) speculators 0.3.0
fails right after the workers start. The shim binds the generator module's ``torch`` to a thin
proxy whose ``cuda.mem_get_info`` reports the CPU KV-cache budget (``VLLM_CPU_KVCACHE_SPACE``
GiB scaled so speculators' own fraction yields it, else available RAM) and whose
``cuda.empty_cache`` does nothing. Everything else is torch itself. When the generator builds its
``ModelConfig`` and the user did not set ``VLLM_CPU_KVCACHE_SPACE``, the budget is chosen for the
generator's own limits (:mod:`speculators_compat.cpu_kv_cache`: ``MAX_NUM_SEQS`` sequences of
``max_model_len`` tokens) instead of 16% of the free memory. On GPUs it is not applied.

Probe: CUDA is not available.
"""

from __future__ import annotations

import os

from .. import cpu_kv_cache
from ..shim import Shim, ShimProxy, replace_attr, undo_all
from ._targets import GENERATOR, module, rewrite_call

NAME = "generator_cpu_memory"


def probe() -> bool:
    import torch

    return not torch.cuda.is_available()


class _CudaOnCpu(ShimProxy):
    """``torch.cuda`` as the generator sees it: memory is the machine's."""

    def __init__(self, real_cuda, gen_module):
        super().__init__(real_cuda)
        self._self_gen = gen_module

    def mem_get_info(self, *args, **kwargs):
        import psutil

        total = psutil.virtual_memory().total
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        if space:
            # speculators takes free * gpu_memory_utilization * CACHE_MEMORY_FRACTION; report a
            # "free" that makes that product the configured CPU KV-cache space.
            fraction = getattr(self._self_gen, "CACHE_MEMORY_FRACTION", 0.2) * 0.8
            return int(float(space) * 2**30 / fraction), total
        return psutil.virtual_memory().available, total

    def empty_cache(self):
        return None


class _TorchOnCpu(ShimProxy):
    """The generator module's ``torch``, with :class:`_CudaOnCpu` as ``torch.cuda``."""

    def __init__(self, real_torch, gen_module):
        super().__init__(real_torch)
        self._self_cuda = _CudaOnCpu(real_torch.cuda, gen_module)

    @property
    def cuda(self):
        return self._self_cuda


def _model_config(_args: tuple, kwargs: dict) -> None:
    if "model" in kwargs and "max_model_len" in kwargs:
        seqs = getattr(module(GENERATOR), "MAX_NUM_SEQS", 32)
        cpu_kv_cache.apply(cpu_kv_cache.choose(kwargs["model"], kwargs["max_model_len"], seqs))


def patch():
    import torch

    gen = module(GENERATOR)
    return undo_all(
        [
            replace_attr(gen, "torch", _TorchOnCpu(torch, gen), NAME),
            rewrite_call("ModelConfig", NAME, _model_config),
        ]
    )


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:torch.cuda.mem_get_info, {GENERATOR}:torch.cuda.empty_cache, "
    f"{GENERATOR}:ModelConfig",
    vllm=">=0.11",
    platform="vllm-cpu",
    symptom="RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
    "NVIDIA GPU and installed a driver",
    upstream="none filed: speculators does not run on vLLM's CPU build",
    remove_when="never on speculators 0.3.x: its generator targets CUDA GPUs",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
