"""Every shim, in the order it is applied. One module per vLLM change point.

The table of what each shim patches, where, and the symptom it fixes is generated from the
records: docs/shims.md (``speculators-compat status --markdown``).

Each module defines ``SHIM`` (a :class:`~speculators_compat.shim.Shim`); its test lives in
``tests/shims/test_<name>.py``.
"""

from __future__ import annotations

from ..shim import Shim
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
    cpu_rotary_embedding_3d,
    distributed_cpu,
    draft_attention_autocast_dtype,
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
    training_resume_step,
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
    cpu_rotary_embedding_3d.SHIM,
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
    training_resume_step.SHIM,
    draft_eager_on_cpu.SHIM,
    draft_attention_cpu_grad.SHIM,
    # After draft_attention_cpu_grad: it wraps that one's replacement (one dtype before either runs).
    draft_attention_autocast_dtype.SHIM,
    checkpointer_cpu.SHIM,
    distributed_cpu.SHIM,
]

BY_NAME: dict[str, Shim] = {s.name: s for s in SHIMS}
