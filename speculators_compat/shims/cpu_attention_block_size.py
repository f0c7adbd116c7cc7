"""vLLM >= 0.29 (0.28's wheel takes any size, 0.29's does not; tested on 0.32), CPU: the CPU
attention kernels take KV-cache blocks of a multiple of 32 only.

speculators 0.3.0 builds its cache config with ``VLLM_BLOCK_SIZE = 16`` (a size every GPU backend
takes). Where ``CPUAttentionBackend.get_supported_kernel_block_sizes()`` does not admit 16, the
worker fails while allocating the KV cache. The shim sets the generator's block size to the
smallest size the backend admits (32), which changes no hidden state: block size only decides
how the KV cache is paged.

Probe: the CPU attention backend declares its kernel block sizes and 16 is not among them.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, module

NAME = "cpu_attention_block_size"
SPECULATORS_BLOCK_SIZE = 16


def _admits(sizes, size: int) -> bool:
    for s in sizes:
        base = getattr(s, "base", None)  # vLLM's MultipleOf(base)
        if (base is not None and size % base == 0) or s == size:
            return True
    return False


def cpu_block_size(preferred: int = SPECULATORS_BLOCK_SIZE) -> int:
    """``preferred`` if the CPU attention backend takes it, else the smallest size it takes."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # older releases (TorchSDPABackend) take any size
        return preferred
    sizes = vars(CPUAttentionBackend).get("get_supported_kernel_block_sizes")
    if sizes is None:  # not declared: the base class admits every size
        return preferred
    declared = CPUAttentionBackend.get_supported_kernel_block_sizes()
    if _admits(declared, preferred):
        return preferred
    return next(n for n in range(preferred, 1025, preferred) if _admits(declared, n))


def probe() -> bool:
    return cpu_block_size(module(GENERATOR).VLLM_BLOCK_SIZE) != module(GENERATOR).VLLM_BLOCK_SIZE


def patch():
    gen = module(GENERATOR)
    return replace_attr(gen, "VLLM_BLOCK_SIZE", cpu_block_size(gen.VLLM_BLOCK_SIZE), NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:VLLM_BLOCK_SIZE",
    vllm=">=0.29",
    platform="vllm-cpu",
    symptom="ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])",
    upstream="none filed: speculators does not run on vLLM's CPU build",
    remove_when="never on speculators 0.3.x: its generator targets CUDA GPUs",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
