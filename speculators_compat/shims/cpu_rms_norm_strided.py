"""vLLM 0.12-0.13 on CPU: RMSNorm misreads a strided (non-contiguous) input.

DeepSeek-V2/V3 attention without MLA (the only kind vLLM's CPU backend has) normalises slices
of a projection (``q_a``/``kv_a`` split off a wider tensor). On the CPU backend of vLLM 0.12 and
0.13, ``RMSNorm`` sends such a view to the C++ ``rms_norm`` kernel, which reads it as if it were
contiguous: every DeepSeek layer output is wrong by 60-90% (relative), silently. From 0.14 on,
vLLM's RMSNorm handles the view. The fix hands the kernel a contiguous copy.

Probe: normalise a strided view with the CPU path and with ``forward_native``; they disagree.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr

NAME = "cpu_rms_norm_strided"
MODULE = "vllm.model_executor.layers.layernorm"


def _cpu_config_context():
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    # custom ops on, as an engine with enforce_eager runs them
    return set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"])))


def probe() -> bool:
    import torch
    from vllm.model_executor.layers.layernorm import RMSNorm

    gen = torch.Generator().manual_seed(0)
    with _cpu_config_context():
        norm = RMSNorm(32, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(32, generator=gen) + 0.5)
        view = torch.randn(5, 48, generator=gen)[:, :32]
        got = norm.forward_cpu(view)
        want = norm.forward_native(view.contiguous())
    return not torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def patch():
    from vllm.model_executor.layers.layernorm import RMSNorm

    original = RMSNorm.forward_cpu

    def forward_cpu(self, x, residual=None):
        if not x.is_contiguous():
            x = x.contiguous()
        if residual is None:
            return original(self, x)
        return original(self, x, residual)

    return replace_attr(RMSNorm, "forward_cpu", forward_cpu, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{MODULE}:RMSNorm.forward_cpu",
    vllm=">=0.12,<0.14",
    platform="vllm-cpu",
    symptom=(
        "no error: DeepSeek-V2/V3 hidden states on the CPU backend differ from the model's own "
        "computation by 0.6-0.9 relative from layer 0 on"
    ),
    upstream="none found; fixed in vLLM 0.14",
    remove_when="vLLM 0.14 (the shim's range ends at 0.13)",
    hook_module=MODULE,
    probe=probe,
    patch=patch,
)
