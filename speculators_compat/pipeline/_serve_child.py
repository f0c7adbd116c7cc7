"""One vLLM engine, as a user serves it: greedy generation on fixed prompts, with or without an
EAGLE-3 draft, timed, with vLLM's own speculative-decoding counters.

Run by path (``python _serve_child.py REQUEST.json RESULT.json``), never imported: the process
must not import ``speculators_compat`` (importing it activates the shims), so what is measured
is vLLM itself. The parent (:mod:`speculators_compat.pipeline.serve`) also leaves
``SPECULATORS_COMPAT_ACTIVE`` out of this process's environment.
"""

from __future__ import annotations

import json
import sys
import time


def main(request_path: str, result_path: str) -> None:
    request = json.loads(open(request_path).read())
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
    if request.get("limit_mm_per_prompt") is not None:
        kwargs["limit_mm_per_prompt"] = request["limit_mm_per_prompt"]
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
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
    }
    with open(result_path, "w") as f:
        json.dump(result, f)


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
