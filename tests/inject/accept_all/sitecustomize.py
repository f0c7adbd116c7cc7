"""Test only (tests/test_serving.py): a vLLM whose rejection sampler accepts every draft token.

Put this folder on PYTHONPATH of a serving engine's process and vLLM's
``vllm.v1.sample.rejection_sampler.rejection_sample`` sees target logits in which each draft token
is the verifier's top choice, so greedy verification keeps whatever the draft proposed: an
injected violation of lossless speculative decoding, which serve-check must name.
"""

import wrapt


def _accept_every_draft_token(module) -> None:
    original = module.rejection_sample

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, *args, **kwargs):  # fmt: skip
        import torch

        forced = target_logits.clone()
        rows = torch.arange(draft_token_ids.shape[0], device=forced.device)
        forced[rows, draft_token_ids.long()] = forced.max() + 100.0
        return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                        forced, *args, **kwargs)  # fmt: skip

    module.rejection_sample = rejection_sample


wrapt.register_post_import_hook(_accept_every_draft_token, "vllm.v1.sample.rejection_sampler")
