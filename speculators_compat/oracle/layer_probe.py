"""Per-layer outputs from a real vLLM engine, through vLLM's public ``LLM`` API.

This is how the test suite (and ``speculators-compat smoke``) proves that vLLM, on this
machine, computes what transformers computes for a fixture model: the engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), ``LLM.apply_model`` registers a forward hook on every
decoder layer, and each prompt is prefilled alone with ``max_tokens=1``, so the hooks see that
prompt's tokens and nothing else. It uses no speculators code and no shim: it is the ground
truth the shims are later compared with.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from .. import cpu_mla
from ..capture import CaptureState
from ..settings import MODALITIES
from ..shims.cpu_attention_block_size import cpu_block_size
from .reference import is_multimodal_wrapper

__all__ = ["VllmLayerProbe", "cpu_engine_env"]


def cpu_engine_env() -> dict[str, str]:
    """Environment defaults for running vLLM's CPU backend on a tiny model: a 1 GiB KV cache is
    plenty and makes start-up fast. Values the caller already set win. Nothing is set when a GPU
    is present. (MLA: :mod:`speculators_compat.cpu_mla` decides per model.)
    """
    if torch.cuda.is_available():
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": "1"}


class VllmLayerProbe:
    """A vLLM ``LLM`` on a local checkpoint with forward hooks on every decoder layer."""

    def __init__(self, model_dir: str | Path, dtype: str = "float32", **engine_kwargs):
        for key, value in {**cpu_engine_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
            os.environ.setdefault(key, value)
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError("VllmLayerProbe needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (in-process engine)")
        from vllm import LLM

        kwargs = dict(
            model=str(model_dir),
            dtype=dtype,
            enforce_eager=True,  # hooks do not run inside compiled graphs
            enable_prefix_caching=False,  # every token's states must be computed
            max_model_len=1024,
            max_num_seqs=8,
            # As speculators 0.3.0 uses (16; 32 where the CPU kernels take no less); with bf16,
            # the CPU default (128) selects an AMX attention kernel these CPU builds lack
            # ("Unsupported CPU attention configuration").
            block_size=cpu_block_size(),
            seed=0,
            trust_remote_code=True,  # local fixtures; Kimi-K2.5 ships its tokenizer as remote code
        )
        if is_multimodal_wrapper(model_dir):
            # text only: every media input limited to 0, so vLLM skips the vision tower

            kwargs["limit_mm_per_prompt"] = {m: 0 for m in MODALITIES}
        mla = cpu_mla.apply(cpu_mla.choose(model_dir))
        if mla is not None and mla.use_mla and mla.backend:
            kwargs["attention_backend"] = mla.backend
        kwargs.update(engine_kwargs)
        self.llm = LLM(**kwargs)
        self._capture: CaptureState | None = None
        self.num_layers = self.llm.apply_model(self._install_hooks)[0]

    def _install_hooks(self, model: torch.nn.Module) -> int:
        self._capture = CaptureState(model)  # every decoder layer
        return len(self._capture.layer_ids)

    def _prefill(self, token_ids: list[int], max_tokens: int):
        from vllm import SamplingParams

        self._capture.begin_step()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        return self.llm.generate([{"prompt_token_ids": list(token_ids)}], params, use_tqdm=False)[0]

    def layer_outputs(self, token_ids: list[int]) -> torch.Tensor:
        """Every decoder layer's output for one prompt: [num_layers, seq_len, hidden]."""
        self._prefill(token_ids, max_tokens=1)
        # One prompt alone: each layer's rows over the prefill's forward passes (several when
        # the prefill is chunked) are exactly its tokens, in order.
        out = torch.stack([torch.cat(rows) for rows in self._capture.step]).float().cpu()
        if out.shape[1] != len(token_ids):
            raise RuntimeError(f"captured {out.shape[1]} token states for a {len(token_ids)}-token prompt")
        return out

    def close(self) -> None:
        """Shut the engine down and reset vLLM's process-wide parallel state, so that the next
        engine in this process starts clean (an MoE model after a dense one needs its
        expert-parallel group created anew)."""
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        self.llm = None
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()

    def generate(self, token_ids: list[int], max_tokens: int = 4) -> list[int]:
        """Greedy continuation of one prompt."""
        return list(self._prefill(token_ids, max_tokens=max_tokens).outputs[0].token_ids)
