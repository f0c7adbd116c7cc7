"""The registry: every shim, in the order it is applied. One module per vLLM change point.

| shim | vLLM | what it fixes |
| --- | --- | --- |
| config_dtype_annotation | all (transformers 5) | import speculators: "name 'torch' is not defined" |
| cpu_attention_block_size | >=0.29, CPU | No common block size for 16 (CPU_ATTN: [MultipleOf(32)]) |
| kernel_rebind_scan | 0.32-0.33 | engine start after numba: '_lib_fn_wrapper' object has no attribute 'get' |
| cpu_rms_norm_strided | 0.12-0.13, CPU | wrong DeepSeek states: CPU RMSNorm misreads strided views |
| cpu_moe_activation_config | 0.14, CPU | "Current vLLM config is not set" in float32 MoE forward |
| cpu_moe_silu_per_call | 0.20-0.24, CPU | "Current vLLM config is not set" in float32 MoE forward |
| generator_executor | all | (isolation) the generator gets a MultiprocExecutor of its own |
| scheduler_config_encoder_decoder | >=0.12 | SchedulerConfig "is_encoder_decoder Field required" |
| cache_config_prefix_caching | >=0.12 | block_hashes assert / prefix-cached tokens never computed |
| kv_cache_layout | >=0.29 | KV cache layout has not been resolved yet |
| kv_cache_utils_moved | >=0.33 | cannot import name '_get_kv_cache_groups_uniform_spec' |
| kv_cache_config_specs | >=0.12 | unexpected keyword argument 'kv_cache_specs' |
| scheduler_block_size | >=0.11.1 | Scheduler missing 'block_size' |
| request_eos_token_id | >=0.17 | Request got an unexpected keyword argument 'eos_token_id' |
| executor_sample_tokens | >=0.11.1 | execute_model returns None; sample_tokens must follow |
| collective_rpc_unique_reply | >=0.11.1 | collective_rpc(unique_reply_rank=0): no list; [0] misreads |
| worker_error_types | all | worker errors re-raised with their type and traceback |
| tokenizer_remote_code | all | Kimi-K2.5's remote-code tokenizer loaded without trust_remote_code |
| generator_cpu_memory | all, CPU | torch.cuda.mem_get_info on a machine without CUDA |
| generator_dtype | all | SPECULATORS_COMPAT_DTYPE instead of dtype='auto' (float32 extraction) |
| cpu_mla_attention | all, CPU | MLA is not supported on CPU (< 0.28); AMX_MLA takes no float32 (>= 0.28) |
| multimodal_text_only | all | Kimi-K2.5: vision tower built and loaded for text-only extraction |
| token_attribution | all | states on the wrong sequence (chunked prefill, >32 seqs, reordering) |
| generate_input_check | all | ids past the vocabulary embedded silently (garbage states); empty sequences |
| hidden_states_capture | all | supports_eagle3 gate, embed_input_ids, llama_4_scaling, wrappers |
| worker_error_details | all | RuntimeError: Worker failed with error '' |
| worker_start_error | all | WorkerProc initialization failed ... See stack trace for root cause. |
| worker_died | all | RuntimeError: cancelled (a worker died during generate; none named) |
| draft_verifier_wrapper | all | draft cannot read a wrapped verifier (Kimi-K2.5) |
| training_target_final_norm | all | targets miss the verifier's final norm |
| training_resume_lr | all | the first step after a resume at the wrong learning rate |
| draft_from_pretrained | all | a saved draft does not load: unexpected keyword argument 'verifier' |
| draft_eager_on_cpu | all, CPU | InductorError: IndexError: tuple index out of range (training on CPU) |
| draft_attention_cpu_grad | >=0.20 (torch 2.11+), CPU | FlexAttention does not support backward on CPU |
| distributed_cpu | all, CPU | torchrun training on CPU: "Found no NVIDIA driver" (accelerator-only setup) |
| checkpointer_cpu | all, CPU | resuming training on CPU: checkpoint loaded onto cuda:0 |

Each module defines ``SHIM`` (a :class:`~speculators_compat.registry.Shim`); its test lives in
``tests/shims/test_<name>.py``.
"""

from __future__ import annotations

from ..registry import Shim
from . import (
    cache_config_prefix_caching,
    checkpointer_cpu,
    collective_rpc_unique_reply,
    config_dtype_annotation,
    cpu_attention_block_size,
    cpu_mla_attention,
    cpu_moe_activation_config,
    cpu_moe_silu_per_call,
    cpu_rms_norm_strided,
    distributed_cpu,
    draft_attention_cpu_grad,
    draft_eager_on_cpu,
    draft_from_pretrained,
    draft_verifier_wrapper,
    executor_sample_tokens,
    generate_input_check,
    generator_cpu_memory,
    generator_dtype,
    generator_executor,
    hidden_states_capture,
    kernel_rebind_scan,
    kv_cache_config_specs,
    kv_cache_layout,
    kv_cache_utils_moved,
    multimodal_text_only,
    request_eos_token_id,
    scheduler_block_size,
    scheduler_config_encoder_decoder,
    token_attribution,
    tokenizer_remote_code,
    training_resume_lr,
    training_target_final_norm,
    worker_died,
    worker_error_details,
    worker_error_types,
    worker_start_error,
)

SHIMS: list[Shim] = [
    config_dtype_annotation.SHIM,
    kernel_rebind_scan.SHIM,
    cpu_rms_norm_strided.SHIM,
    cpu_moe_activation_config.SHIM,
    cpu_moe_silu_per_call.SHIM,
    kv_cache_utils_moved.SHIM,
    generator_executor.SHIM,
    scheduler_config_encoder_decoder.SHIM,
    cache_config_prefix_caching.SHIM,
    kv_cache_config_specs.SHIM,
    kv_cache_layout.SHIM,
    scheduler_block_size.SHIM,
    cpu_attention_block_size.SHIM,
    request_eos_token_id.SHIM,
    executor_sample_tokens.SHIM,
    collective_rpc_unique_reply.SHIM,
    worker_error_types.SHIM,
    tokenizer_remote_code.SHIM,
    generator_cpu_memory.SHIM,
    generator_dtype.SHIM,
    cpu_mla_attention.SHIM,
    multimodal_text_only.SHIM,
    token_attribution.SHIM,
    generate_input_check.SHIM,
    hidden_states_capture.SHIM,
    worker_error_details.SHIM,
    worker_start_error.SHIM,
    worker_died.SHIM,
    draft_verifier_wrapper.SHIM,
    training_target_final_norm.SHIM,
    draft_from_pretrained.SHIM,
    training_resume_lr.SHIM,
    draft_eager_on_cpu.SHIM,
    draft_attention_cpu_grad.SHIM,
    checkpointer_cpu.SHIM,
    distributed_cpu.SHIM,
]

BY_NAME: dict[str, Shim] = {s.name: s for s in SHIMS}
