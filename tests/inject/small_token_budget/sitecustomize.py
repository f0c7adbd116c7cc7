"""Test only (tests/test_ablations.py): speculators' generator with a scheduler step of at most
512 tokens instead of 8,192, so that the tiny demo's 30-token conversations, 32 to a step, are
prefilled in chunks, as Kimi-K2.5's 2,000-8,000-token conversations are at 8,192.

Put this folder on PYTHONPATH of an ``extract`` process: ``max_num_batched_tokens`` becomes
``max(512, max_model_len)``. With the ``token_attribution`` shim on, nothing changes but speed;
with it off, speculators 0.3.0's offset slicing hands sequences each other's states (speculators #279).
"""

import wrapt


def _small_token_budget(module) -> None:
    module.MIN_MAX_BATCHED_TOKENS = 512


GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
wrapt.register_post_import_hook(_small_token_budget, GENERATOR)
