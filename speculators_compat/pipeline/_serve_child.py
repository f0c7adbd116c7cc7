"""One vLLM engine, as a user serves it: greedy generation on fixed prompts, with or without an
EAGLE-3 draft, timed, with vLLM's own speculative-decoding counters; or (``chats`` in the
request) every assistant turn of a chat dataset answered again by the model.

Run by path (``python _serve_child.py REQUEST.json RESULT.json``), never imported: the script
does not import ``speculators_compat`` (importing it activates every shim), so what is measured
is vLLM itself; the parent (:mod:`speculators_compat.pipeline.serve`) sets the environment so
that vLLM's plugin activates only the shims that fix vLLM's own engine.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=request["verifier"],
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        # Same scheduling with and without the draft; every prompt's prefill computed.
        enable_prefix_caching=False,
        max_num_seqs=request["max_num_seqs"],
        # vLLM warms up with a batch of this many tokens (CPU default 4096: ~30 s on 2 cores).
        max_num_batched_tokens=max(request["max_model_len"], 1024),
        # Engine and worker in this process: one vLLM import instead of three.
        distributed_executor_backend="uni",
    )
    if request.get("draft"):
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": request["draft"],
            "num_speculative_tokens": request["num_speculative_tokens"],
        }
    if request.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    if request.get("hf_overrides"):
        kwargs["hf_overrides"] = request["hf_overrides"]
    if request.get("attention_backend"):
        kwargs["attention_backend"] = request["attention_backend"]
    if request.get("limit_mm_per_prompt") is not None:
        kwargs["limit_mm_per_prompt"] = request["limit_mm_per_prompt"]
    llm = LLM(**kwargs)
    if request.get("chats") is not None:
        result = _chat(llm, request, SamplingParams, TokensPrompt)
    else:
        result = _generate(llm, request, SamplingParams, TokensPrompt)
    # what the CPU platform gave the KV cache (None on GPUs)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    # vLLM's name for it: cpu_kvcache_space_bytes (up to 0.2x), kv_cache_memory_bytes (0.32)
    result["kv_cache_bytes"] = getattr(cache, "cpu_kvcache_space_bytes", None) or getattr(
        cache, "kv_cache_memory_bytes", None
    )
    with open(result_path, "w") as f:
        json.dump(result, f)


def _generate(llm, request, SamplingParams, TokensPrompt) -> dict:
    """Greedy continuations of token-id prompts, timed after a warm-up, with spec counters."""
    params = SamplingParams(
        temperature=0.0,
        max_tokens=request["max_tokens"],
        ignore_eos=not request.get("stop_at_eos", False),
        logprobs=request.get("logprobs"),
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    # Warm-up (first-call allocations) on a prompt of the set, then the timed pass.
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    before = _spec_counters(llm)
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = _spec_counters(llm)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    result = {
        "outputs": tokens,
        "seconds": seconds,
        "generated": sum(len(t) for t in tokens),
        "counters": {k: _minus(after[k], before.get(k)) for k in after},
        "dtype": str(llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch."),
    }
    if request.get("logprobs"):
        # per generated token: the top-1/top-2 logprob gap (= the logit gap) and the gap between
        # the first and the last of the top logprobs returned (the logits' spread there)
        result["margins"], result["spreads"] = zip(
            *[_gaps(o.outputs[0].logprobs) for o in outputs], strict=True
        )
    return result


def _gaps(per_token) -> tuple[list[float], list[float]]:
    margins, spreads = [], []
    for top in per_token or []:
        values = sorted((lp.logprob for lp in top.values()), reverse=True)
        margins.append(values[0] - values[1] if len(values) > 1 else float("inf"))
        spreads.append(values[0] - values[-1])
    return margins, spreads


def _chat(llm, request, SamplingParams, TokensPrompt) -> dict:
    """The model's greedy answer at every assistant turn of ``chats`` (lists of {role,
    content}), as token ids: the conversation up to that turn is formatted as speculators'
    preprocessing formats it (chat template text, tokens without added special tokens), and the
    answer is kept as the ids the model produced (decoding and re-encoding a model's output can
    tokenize it differently, and then the data no longer says what the model would say)."""
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    todo, prompts, skipped = [], [], 0
    for ci, chat in enumerate(request["chats"]):
        for at, message in enumerate(chat):
            if message["role"] != "assistant":
                continue
            text = tokenizer.apply_chat_template(chat[:at], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            # (the generator keeps at most max_model_len - 1 tokens of a sequence)
            if len(ids) + request["max_tokens"] > request["max_model_len"] - 1:
                skipped += 1  # no room for an answer within the sequence length
                continue
            todo.append((ci, at))
            prompts.append(ids)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    samples = []
    for (ci, at), ids, out in zip(todo, prompts, outputs, strict=True):
        answer = list(out.outputs[0].token_ids)
        samples.append(
            {
                "conversation": ci,
                "turn": at,
                "prompt_ids": ids,
                "answer_ids": answer,
                "answer": tokenizer.decode(answer, skip_special_tokens=True),
            }
        )
    return {"samples": samples, "skipped": skipped}


def _spec_counters(llm) -> dict:
    """vLLM's ``vllm:spec_decode_*`` metrics: counters as ints, the per-position vector as a list."""
    found = {}
    for metric in llm.get_metrics():
        if not metric.name.startswith("vllm:spec_decode"):
            continue
        value = getattr(metric, "values", None)
        value = list(value) if value is not None else getattr(metric, "value", None)
        if isinstance(value, list) and isinstance(found.get(metric.name), list):
            value = [a + b for a, b in zip(found[metric.name], value, strict=False)]
        elif isinstance(value, int | float) and metric.name in found:
            value = found[metric.name] + value
        found[metric.name] = value
    return found


def _minus(after, before):
    if before is None:
        return after
    if isinstance(after, list):
        return [a - b for a, b in zip(after, before, strict=False)]
    return after - before


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
