"""Each sequence gets exactly its own tokens' states, in input order.

speculators 0.3.0's ``generate`` adds every sequence, runs ``schedule()``/``execute_model`` and
aborts every request that was scheduled once, then slices one flat concatenation of captured
rows by prompt offsets. That is right only if each prompt is prefilled whole, in one step, in
input order. With chunked prefill (a prompt longer than ``max_num_batched_tokens``, or a step
full of other prompts) the abort cuts the prompt short, and with more sequences than
``max_num_seqs`` or requests reordered by vLLM the offsets point into other sequences: states
land on the wrong sequence, silently, or the slices come back short.

The replacement drives the scheduler the way vLLM's engine core does (``schedule`` →
``execute_model`` → ``update_from_output`` until no request is unfinished, so finished requests
free their slots), and collects each request's own rows, filed by the worker per step
(``hidden_states_capture``). Request ids are zero-padded, so string order is input order.
It raises, naming the sequence, if any sequence's states do not cover all of its tokens.

Probe: ``generate`` is speculators 0.3.0's offset-slicing one.
"""

from __future__ import annotations

import inspect
import logging

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, module

NAME = "token_attribution"
log = logging.getLogger("speculators_compat")


def probe() -> bool:
    source = inspect.getsource(module(GENERATOR).VllmHiddenStatesGenerator.generate)
    return "offset += seq_len" in source


def _unwrap(reply):
    # A one-item list (vLLM 0.11, or collective_rpc_unique_reply) or the reply itself.
    if isinstance(reply, list) and len(reply) == 1 and (reply[0] is None or isinstance(reply[0], dict)):
        return reply[0]
    return reply


def generate(self, token_ids):
    from ..capture import unpack_states

    gen = module(GENERATOR)
    torch = gen.torch
    if isinstance(token_ids, torch.Tensor):
        sequences = token_ids.tolist()
    else:
        if not token_ids:
            raise ValueError("token_ids cannot be empty")
        sequences = [ids.tolist() if isinstance(ids, torch.Tensor) else list(ids) for ids in token_ids]
    # vLLM enforces len(prompt) + max_tokens <= max_model_len, and max_tokens is 1.
    max_len = self.vllm_config.model_config.max_model_len - 1
    truncated = sum(len(ids) > max_len for ids in sequences)
    if truncated:
        log.warning(
            "%d of %d sequences truncated to %d tokens (max_model_len - 1)",
            truncated,
            len(sequences),
            max_len,
        )
    sequences = [ids[:max_len] for ids in sequences]
    empty = [i for i, ids in enumerate(sequences) if not ids]
    if empty:
        raise ValueError(f"sequences {empty[:10]} are empty: every sequence needs at least one token")

    batch = self._request_counter
    self._request_counter += 1
    width = len(str(len(sequences)))
    req_ids = [f"req_{batch}_{i:0{width}d}" for i in range(len(sequences))]
    for req_id, ids in zip(req_ids, sequences, strict=True):
        self.scheduler.add_request(
            gen.Request(
                request_id=req_id,
                prompt_token_ids=ids,
                sampling_params=gen.SamplingParams(
                    max_tokens=gen.MAX_DECODE_TOKENS, temperature=gen.SAMPLING_TEMPERATURE
                ),
                pooling_params=None,
                eos_token_id=self.tokenizer.eos_token_id,
                arrival_time=gen.INITIAL_ARRIVAL_TIME,
            )
        )

    steps = 0
    while self.scheduler.has_unfinished_requests():
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.total_num_scheduled_tokens == 0:
            raise RuntimeError(
                "the vLLM scheduler scheduled nothing while requests were unfinished "
                "(is the KV cache too small for one sequence of max_model_len tokens?)"
            )
        output = self.executor.execute_model(scheduler_output)
        self.scheduler.update_from_output(scheduler_output, output)
        steps += 1

    rpc = self.executor.collective_rpc
    packed = _unwrap(rpc("_compat_take_states", args=(req_ids,), unique_reply_rank=0))
    if packed is None:
        raise RuntimeError("the rank-0 worker returned no hidden states")
    by_request = unpack_states(packed)
    log.debug("%d sequences in %d scheduler steps", len(sequences), steps)

    results = []
    for i, (req_id, ids) in enumerate(zip(req_ids, sequences, strict=True)):
        layers = by_request.get(req_id)
        if layers is None or any(h.shape[0] != len(ids) for h in layers):
            got = None if layers is None else [h.shape[0] for h in layers]
            raise RuntimeError(
                f"sequence {i} ({len(ids)} tokens): captured states cover {got} tokens per layer"
            )
        results.append(
            {
                "input_ids": torch.as_tensor(ids, dtype=torch.long),
                "hidden_states": [h.cpu() for h in layers],
                "loss_mask": None,
            }
        )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def patch():
    cls = module(GENERATOR).VllmHiddenStatesGenerator
    return replace_attr(cls, "generate", generate, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:VllmHiddenStatesGenerator.generate",
    vllm=">=0.11",
    symptom="no error: with chunked prefill, more sequences than max_num_seqs (32) or reordered "
    "requests, hidden states land on the wrong sequence or come back short",
    upstream="speculators issue #279, fixed by PR #283",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    requires=("hidden_states_capture",),
)
