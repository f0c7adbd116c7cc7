"""serve-check: the run's draft served by vLLM's own EAGLE-3 speculative decoding, measured.

The reason to train a draft is to serve it next to its verifier. This stage starts vLLM twice on
the run's verifier, on prompts the draft was not trained on (the validation samples, cut inside
their assistant turn): once with the draft as an EAGLE-3 speculator, once without. It reports
vLLM's own ``vllm:spec_decode_*`` counters (acceptance rate, accepted tokens per position, mean
accepted length), tokens/s both ways, and whether greedy outputs are identical (speculative
decoding is lossless: they must be).

Each engine runs in a child process whose script never imports ``speculators_compat``; vLLM's
plugin activates there only the shims that fix vLLM's own engine (``Shim.serving``, e.g. its CPU
float32 MoE on 0.20-0.24), none on speculators' path: what is measured is vLLM as a user serves
the draft.

Layer ids. speculators 0.3.0 captures decoder layer k's *output*; vLLM's
``eagle_aux_hidden_state_layer_ids`` entry k is the state *entering* layer k. The draft's
auxiliary inputs captured at layer ids ``[a, b, c]`` (the fourth id is the layer the training
targets come from) are therefore served with ids ``[a + 1, b + 1, c + 1]``:
:func:`~speculators_compat.pipeline.samples.vllm_aux_layer_ids`, which ``train`` writes into
the draft's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import cpu_kv_cache, cpu_mla, versions
from ..registry import ACTIVE_ENV, DISABLE_ENV, left_out
from ..settings import MODALITIES
from ..shims import SHIMS
from ..versions import in_range
from .errors import PipelineError
from .layout import RunFolder
from .model_info import inspect_model
from .samples import uncovered_rows, vllm_aux_layer_ids

log = logging.getLogger("speculators_compat.pipeline")

#: vLLM's CPU builds that run EAGLE-3 speculative decoding: from 0.20 (up to 0.19 the CPU model
#: runner asserts "spec decode is not supported."); 0.23 and 0.24's CPU builds die at engine start
#: with a speculative config (``_sample_recovered_tokens_kernel_impl() got an unexpected keyword
#: argument 'USE_FP64_GUMBEL'``), fixed by 0.32 (0.25-0.31 not checked).
CPU_SPEC_DECODE = ">=0.20,<0.23 || >=0.32"


def cpu_spec_decode_text() -> str:
    """:data:`CPU_SPEC_DECODE` in words: ``0.20-0.22 or 0.32 and later``."""
    words = []
    for part in CPU_SPEC_DECODE.split("||"):
        bounds = dict(re.findall(r"(>=|<)\s*([\d.]+)", part))
        low, high = bounds.get(">="), bounds.get("<")
        if high:
            major, minor = high.split(".")[:2]
            words.append(f"{low}-{major}.{int(minor) - 1}")
        else:
            words.append(f"{low} and later")
    return " or ".join(words)


def cpu_spec_decode_unsupported() -> str | None:
    """Why the installed vLLM cannot serve an EAGLE-3 draft on this machine, or None if it can."""
    import torch

    version = versions.installed_versions().vllm
    if version is None:
        return "vLLM is not installed"
    if torch.cuda.is_available():
        return None
    if any(in_range(version, part.strip()) for part in CPU_SPEC_DECODE.split("||")):
        return None
    return (
        f"vLLM {version}'s CPU backend cannot run EAGLE-3 speculative decoding here (CPU builds "
        f"that can: {CPU_SPEC_DECODE}; up to 0.19: 'spec decode is not supported.'; 0.23/0.24: "
        "'unexpected keyword argument USE_FP64_GUMBEL')"
    )


def latest_checkpoint(run: RunFolder) -> Path:
    epochs = sorted(int(p.name) for p in run.checkpoints.glob("*") if p.name.isdigit())
    if not epochs:
        raise PipelineError(f"{run.checkpoints} holds no draft: run train first.")
    return run.checkpoints / str(epochs[-1])


def draft_with_aux_ids(draft: Path, folder: Path, ids: list[int] | None | str) -> Path:
    """A copy of ``draft`` in ``folder`` whose ``eagle_aux_hidden_state_layer_ids`` are ``ids``
    (``"missing"``: the field removed): to measure, or refuse, a draft configured wrongly."""
    shutil.copytree(draft, folder)
    config = json.loads((folder / "config.json").read_text())
    if ids == "missing":
        del config["eagle_aux_hidden_state_layer_ids"]
    else:
        config["eagle_aux_hidden_state_layer_ids"] = ids
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def held_out_samples(run: RunFolder) -> list[int]:
    """The samples training kept for validation (recorded by ``train``)."""
    facts = run.done("train") or {}
    held = facts.get("validation_samples")
    if held is None:
        raise PipelineError(
            f"{run.root}'s training did not record its validation samples (a run from an older "
            "speculators-compat): run train again to serve-check on held-out prompts."
        )
    return list(held)


def held_out_windows(run: RunFolder, count: int, into_turn: int) -> list[tuple[int, int, list[int]]]:
    """Up to ``count`` (sample index, cut, token ids) triples: validation samples cut ``into_turn``
    tokens into their first assistant turn (0: the verifier answers the question, as it does
    when serving; the draft proposes from its second token on)."""
    import torch

    windows = []
    for i in held_out_samples(run):
        # Memory-mapped: only the ids and mask are read, not the states (MBs a sample at 7168 wide).
        data = torch.load(run.hidden_states / f"data_{i}.pt", weights_only=True, mmap=True)
        ids, mask = data["input_ids"].tolist(), data["loss_mask"].tolist()
        if 1 not in mask:
            continue
        windows.append((i, min(mask.index(1) + into_turn, len(ids) - 1), ids))
        if len(windows) == count:
            break
    if not windows:
        raise PipelineError(f"{run.root} has no held-out sample with an assistant turn to prompt with.")
    return windows


def expected_acceptance(
    run: RunFolder, draft: Path, windows: list[tuple[int, int, list[int]]], max_tokens: int, steps: int
) -> tuple[int, list[int]]:
    """What speculators' own draft (its training forward, on the held-out samples' extracted
    states) predicts vLLM should accept: greedy speculative decoding replayed over each window,
    a draft of ``steps`` tokens after every verification. Returns (drafts, accepted per position).

    Valid where the verifier's greedy continuation of the prompt is the sample itself (data from
    ``prepare --regenerate``); then vLLM's counters must agree, up to numerical near-ties."""
    import numpy as np
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    d2t = torch.from_numpy(np.load(run.vocab / "d2t.npy"))
    t2d = torch.from_numpy(np.load(run.vocab / "t2d.npy"))
    model = Eagle3DraftModel.from_pretrained(str(draft), t2d=t2d, d2t=d2t).eval()
    for module in model.modules():  # from_pretrained leaves the layer's attention unset
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = "simple_flex_attention"
    drafts, accepted = 0, [0] * steps
    for i, cut, _ in windows:
        data = torch.load(run.hidden_states / f"data_{i}.pt", weights_only=True)
        ids = data["input_ids"]
        n = len(ids)
        covered = uncovered_rows(data["hidden_states"], n)
        if covered:
            raise PipelineError(
                f"{run.hidden_states / f'data_{i}.pt'} holds {n} tokens but states of {covered} rows "
                "a layer: the extraction is damaged (states sliced from other sequences, or a cut "
                "file). Delete the run's hidden_states/ and run extract again."
            )
        states = torch.cat(data["hidden_states"][:-1], dim=-1).float()
        # speculators' alignment (train/data.py shift_batch): position j holds state j and token
        # j + 1 and predicts token j + 2; test-time-training step k continues the same position's
        # chain (core.py align_for_step): its output at j predicts token j + 2 + k. Padded to the
        # flex-attention block size.
        width = -(-(n - 1) // 128) * 128
        h = torch.zeros(1, width, states.shape[1])
        h[0, : n - 1] = states[:-1]
        x = torch.zeros(1, width, dtype=torch.long)
        x[0, : n - 1] = ids[1:]
        with torch.no_grad():
            tokens = model(
                h,
                x,
                lengths=torch.tensor([n - 1]),
                position_ids=torch.arange(1, width + 1)[None],
                ttt_steps=steps,
            )
        proposals = [t[0] + model.d2t[t[0]] for t in tokens]  # in the verifier's vocabulary
        # x_p: the newest verified token. As vLLM serves (stopping at the end of the answer, the
        # sample's last token), a draft follows every verification until the sample ends; what it
        # proposes past the end is never accepted.
        p, end = cut, min(cut + max_tokens - 1, n - 1)
        while p < end:
            k = 0
            while k < steps and p + 1 + k < n and int(proposals[k][p - 1]) == int(ids[p + 1 + k]):
                accepted[k] += 1
                k += 1
            drafts += 1
            p += k + 1
    return drafts, accepted


#: Top logprobs the engine without the draft returns per generated token (vLLM's default
#: ``max_logprobs``): the verifier's own margin where outputs part, and the logits' spread there.
LOGPROBS = 20


@dataclass
class Divergence:
    """Where the outputs with and without the draft part for one prompt, and what the verifier
    (the engine without the draft) thought of that token."""

    prompt: int
    position: int
    #: top-1 minus top-2 logprob of the verifier there (None: past the end of its output)
    margin: float | None
    #: the largest margin the dtype's rounding can overturn there (:func:`tie_tolerance`)
    tolerance: float

    @property
    def tie(self) -> bool:
        return self.margin is not None and self.margin <= self.tolerance

    def line(self) -> str:
        margin = "none (past the end of its output)" if self.margin is None else f"{self.margin:.2e}"
        kind = "numerical tie" if self.tie else "VIOLATION"
        where = f"prompt {self.prompt}, token {self.position}"
        return f"{where}: verifier margin {margin}, tolerance {self.tolerance:.2e}: {kind}"


def tie_tolerance(dtype: str, spread: float) -> float:
    """The largest top-1/top-2 logit gap that rounding can overturn between vLLM's batched
    verification and its one-token decode: each of the two logits may be off by the relative
    error bound of vLLM's states in ``dtype`` on weights like a served model's (sharp attention:
    :func:`~speculators_compat.oracle.reference.tolerance`, measured against transformers; 1e-4
    in float32, 5e-2 in bfloat16) times the logits' scale there, taken as the spread of the
    verifier's top logprobs."""
    from ..oracle.reference import tolerance

    return (
        2
        * tolerance(dtype if dtype in ("float32", "bfloat16", "float16") else "bfloat16", sharp=True)
        * spread
    )


def divergences(base: dict, spec: dict) -> list[Divergence]:
    """Each prompt whose greedy output with the draft differs from the one without it."""
    found = []
    for i, (a, b) in enumerate(zip(base["outputs"], spec["outputs"], strict=True)):
        if a == b:
            continue
        j = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        margins, spreads = base["margins"][i], base["spreads"][i]
        inside = j < len(margins)
        found.append(
            Divergence(
                prompt=i,
                position=j,
                margin=margins[j] if inside else None,
                tolerance=tie_tolerance(base["dtype"], spreads[j]) if inside else 0.0,
            )
        )
    return found


@dataclass
class ServeReport:
    draft: str
    aux_layer_ids: list[int] | None
    prompts: int
    max_tokens: int
    num_speculative_tokens: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_rate: float
    acceptance_per_position: list[float]
    mean_accepted_length: float
    tokens_per_s_with: float
    tokens_per_s_without: float
    speedup: float
    identical: bool
    #: speculators' own draft forward replayed over the same windows (:func:`expected_acceptance`).
    expected_drafts: int = 0
    expected_per_position: list[float] = field(default_factory=list)
    mismatched_prompts: list[int] = field(default_factory=list)
    #: Where outputs part: numerical ties (the verifier's margin within :func:`tie_tolerance`)
    #: and violations (anything else: the draft changed what the verifier says).
    ties: list[dict] = field(default_factory=list)
    violations: list[dict] = field(default_factory=list)
    #: Shims active in the serving engines (fixes of vLLM's own engine bugs only).
    serving_shims: list[str] = field(default_factory=list)
    #: What vLLM served the verifier in (the run's extraction dtype, unless ``--dtype``).
    dtype: str = "auto"

    @property
    def lossless(self) -> bool:
        """Greedy outputs identical, or differing only at numerical ties."""
        return not self.violations

    def lines(self) -> list[str]:
        per_pos = " ".join(f"{r:.3f}" for r in self.acceptance_per_position)
        return [
            f"draft          {self.draft} (aux layer ids {self.aux_layer_ids})",
            f"prompts        {self.prompts} held-out prompts, {self.max_tokens} greedy tokens each, "
            f"{self.num_speculative_tokens} speculative tokens, verifier in {self.dtype}",
            f"acceptance     {self.acceptance_rate:.3f} ({self.accepted_tokens} of {self.draft_tokens} "
            f"drafted tokens, {self.drafts} drafts)",
            f"per position   {per_pos}  (accepted {self.accepted_per_position})",
            "training code  "
            + " ".join(f"{r:.3f}" for r in self.expected_per_position)
            + f"  (speculators' draft forward replayed on the same windows, {self.expected_drafts} drafts)",
            f"mean accepted length {self.mean_accepted_length:.2f} tokens per verifier step",
            f"tokens/s       {self.tokens_per_s_with:.1f} with the draft, {self.tokens_per_s_without:.1f} "
            f"without: {self.speedup:.2f}x",
            "lossless       "
            + (
                "yes: greedy outputs identical"
                if self.identical
                else f"yes: outputs differ only at numerical ties ({len(self.ties)} prompts)"
                if self.lossless
                else f"NO: {len(self.violations)} prompts differ where the verifier was not tied"
            ),
            *(f"  {Divergence(**d).line()}" for d in self.violations + self.ties),
            "engines        plain vLLM; shims kept for vLLM's own bugs: "
            + (", ".join(self.serving_shims) or "none"),
        ]


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.*)$")


def _root_cause(stderr: str) -> str:
    """The first exception line in a (worker-prefixed) vLLM log: the cause, not the wrapper."""
    for line in stderr.splitlines():
        m = _ERROR_LINE.search(line)
        if m and "Engine core initialization failed" not in line:
            return f"{m.group(1)}: {m.group(2)}"
    return "no exception in its log (see below)"


def serving_shims() -> list[str]:
    """The shims the serving engines keep: those fixing bugs of vLLM's own engine on this
    platform (e.g. vLLM 0.20-0.24's CPU float32 MoE), nothing on speculators' path, less those
    the user leaves out (``SPECULATORS_COMPAT_DISABLE``, as everywhere else)."""
    return [s.name for s in SHIMS if s.serving and not left_out(s.name)]


def run_engine(request: dict) -> dict:
    """One engine in a child process (the script never imports speculators_compat); vLLM's
    plugin activates only :func:`serving_shims` in the engine's processes."""
    keep = set(serving_shims())
    mla = cpu_mla.apply(cpu_mla.choose(request["verifier"]))
    if mla is not None and mla.use_mla and mla.backend:
        request = {**request, "attention_backend": mla.backend}
    draft_layers = 1 if request.get("draft") else 0  # an EAGLE-3 draft has one decoder layer
    limits = (request["max_model_len"], request["max_num_seqs"], draft_layers)
    cpu_kv_cache.apply(cpu_kv_cache.choose(request["verifier"], *limits))
    env = dict(os.environ)
    env[ACTIVE_ENV] = "1"
    env[DISABLE_ENV] = ",".join(s.name for s in SHIMS if s.name not in keep)
    with tempfile.TemporaryDirectory(prefix="serve-check-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        child = Path(__file__).with_name("_serve_child.py")
        proc = subprocess.run(
            [sys.executable, str(child), str(req), str(res)],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not res.is_file():
            what = "with the draft" if request.get("draft") else "without a draft"
            raise PipelineError(
                f"vLLM {what} failed (exit {proc.returncode}): {_root_cause(proc.stderr)}\n"
                + "\n".join(proc.stderr.strip().splitlines()[-12:])
            )
        return json.loads(res.read_text())


def serve_check(
    run: RunFolder,
    *,
    draft: str | Path | None = None,
    prompts: int = 64,
    max_tokens: int = 32,
    into_turn: int = 0,
    num_speculative_tokens: int = 3,
    dtype: str | None = None,
    check_layer_ids: bool = True,
) -> ServeReport:
    """Serve ``draft`` (default: the run's latest checkpoint) and measure it; see the module doc.

    ``check_layer_ids``: refuse a draft whose ``eagle_aux_hidden_state_layer_ids`` are not the
    ones its training data was captured at (off only to measure such a draft on purpose)."""
    reason = cpu_spec_decode_unsupported()
    if reason:
        raise PipelineError(
            f"{reason}. Serve the draft on a GPU, or check it with a CPU build of {cpu_spec_decode_text()}."
        )
    run_spec = run.spec()
    draft = Path(draft) if draft else latest_checkpoint(run)
    config = json.loads((draft / "config.json").read_text())
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    expected = vllm_aux_layer_ids(run.captured_layer_ids())
    if check_layer_ids and aux != expected:
        raise PipelineError(
            f"{draft}/config.json has eagle_aux_hidden_state_layer_ids {aux}, but its training data "
            f"was captured at layer ids {run.captured_layer_ids()}, which vLLM names {expected} (vLLM's "
            "id k is the state entering layer k). Train it again with this version of "
            f'speculators-compat, or set "eagle_aux_hidden_state_layer_ids": {expected} there.'
        )
    windows = held_out_windows(run, prompts, into_turn)
    chosen = [ids[:cut] for _, cut, ids in windows]
    longest = max(len(p) for p in chosen) + max_tokens + num_speculative_tokens + 1
    request = {
        "verifier": run_spec.model,
        # the dtype the run extracted its training states in (vLLM's "auto" if none was chosen)
        "dtype": dtype or run_spec.dtype or "auto",
        "max_model_len": max(longest, 256),
        "max_num_seqs": len(chosen),
        "prompts": chosen,
        "max_tokens": max_tokens,
        "num_speculative_tokens": num_speculative_tokens,
        "trust_remote_code": True,
        # Real serving stops at the end of the answer (the verifier's end-of-turn token).
        "stop_at_eos": True,
    }

    if inspect_model(run_spec.model).wrapper:
        # Text-only serving of a multimodal wrapper (Kimi-K2.5): no image inputs.
        request["limit_mm_per_prompt"] = text_only_limits()
    base = run_engine({**request, "logprobs": LOGPROBS})
    spec = run_engine({**request, "draft": str(draft)})
    c = spec["counters"]
    drafts = int(c.get("vllm:spec_decode_num_drafts", 0))
    draft_tokens = int(c.get("vllm:spec_decode_num_draft_tokens", 0))
    accepted = int(c.get("vllm:spec_decode_num_accepted_tokens", 0))
    per_pos = [int(v) for v in c.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])]
    if drafts == 0:
        raise PipelineError(
            "vLLM served the verifier with the draft but counted no drafts "
            f"(spec-decode counters: {c}): speculative decoding did not run."
        )
    parted = divergences(base, spec)
    expected_drafts, expected = expected_acceptance(run, draft, windows, max_tokens, num_speculative_tokens)
    with_s = spec["generated"] / spec["seconds"]
    without_s = base["generated"] / base["seconds"]
    report = ServeReport(
        draft=str(draft),
        aux_layer_ids=aux,
        prompts=len(chosen),
        max_tokens=max_tokens,
        num_speculative_tokens=num_speculative_tokens,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        accepted_per_position=per_pos,
        acceptance_rate=accepted / draft_tokens if draft_tokens else 0.0,
        acceptance_per_position=[v / drafts for v in per_pos],
        mean_accepted_length=1 + accepted / drafts,
        tokens_per_s_with=with_s,
        tokens_per_s_without=without_s,
        speedup=with_s / without_s,
        identical=not parted,
        expected_drafts=expected_drafts,
        expected_per_position=[v / max(expected_drafts, 1) for v in expected],
        mismatched_prompts=[d.prompt for d in parted],
        ties=[dataclasses.asdict(d) for d in parted if d.tie],
        violations=[dataclasses.asdict(d) for d in parted if not d.tie],
        serving_shims=serving_shims(),
        dtype=spec["dtype"],
    )
    return report


def text_only_limits() -> dict[str, int]:
    """``limit_mm_per_prompt`` for a multimodal wrapper served text-only (Kimi-K2.5)."""
    return {m: 0 for m in MODALITIES}
