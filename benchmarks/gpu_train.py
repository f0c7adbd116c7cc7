"""The pipeline's ``train`` on one GPU: the demo's run on the GPU against its CPU run, and the
Kimi-K2.5-sized draft's step time, throughput, peak memory and largest batch.

Needs a CUDA GPU, torch, and speculators 0.3.0 with transformers 4.57 (no vLLM: training starts
no engine). Everything goes through the documented entry point: ``speculators-compat train``
(here ``cli.main(["train", ...])`` in this process, so that its CUDA memory can be read).

demo (``--demo RUN``): RUN is a finished ``speculators-compat demo`` folder made on a CPU machine
(its ``train_metrics.jsonl`` holds the CPU losses). A copy is trained again here with the same
settings and seed, on its verifier carried along (``--demo-model``; without it the
deepseek-v3-tiny fixture is built here); the copy's ``run.json`` is pointed at it. Printed:
``status``, whether the draft was compiled (``torch._dynamo`` graphs), and the GPU losses against
the CPU's, step by step.

kimi (``--kimi``): a verifier folder of Kimi-K2.5's real config (``fixtures/preflight``), holding
only what the draft reads, the embedding, final norm and LM head (hidden 7,168, vocabulary
163,840), random, made on the GPU; synthetic hidden-state files of the real shape (4 layers x
7,168, bfloat16, sample lengths uniform in [--min-len, --max-len], seeded); a draft vocabulary of
32,000. Then, per ``--total-seq-lens`` (tokens per packed batch), one epoch of about ``--steps``
steps with speculators' defaults otherwise, until one does not fit. Printed per batch size: the
median step after ``--warmup`` steps (the first compiles), tokens/s, peak CUDA memory, and the
epoch's end (validation and checkpoint). The epoch estimate for 7,000 samples on 8 GPUs assumes
the synthetic set's mean sample length and linear scaling (the 8-GPU run is issue 16's).

    python benchmarks/gpu_train.py [--demo RUN] [--kimi] [--total-seq-lens 4096,8192,16384]
                                   [--steps 8] [--num-workers N] [--precision fp32|tf32|bf16]
                                   [--foreach-adamw] [--pad-multiple N]
                                   [--work DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KIMI_CONFIG = ROOT / "fixtures" / "preflight" / "kimi-k25-config.json"
PREFIX = "language_model."  # where Kimi-K2.5's checkpoint keeps its text model
GB = 2**30


def log(msg: str) -> None:
    print(msg, flush=True)


def environment() -> dict:
    import subprocess

    import torch
    import transformers

    from speculators_compat.versions import installed_versions

    cuda = torch.cuda.is_available()
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    driver = subprocess.run(smi, capture_output=True, text=True).stdout.strip() if cuda else None
    return {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "nvidia_smi": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "versions": installed_versions().line(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }


def cli(*args: str) -> None:
    from speculators_compat.cli import main

    try:
        main(list(args), standalone_mode=False)
    except SystemExit as exc:  # the CLI's clear errors end in sys.exit(2)
        if exc.code:
            # train's clear error for a step that did not fit wraps CUDA's: hand that on
            oom = getattr(exc.__context__, "__cause__", None)
            if type(oom).__name__ == "OutOfMemoryError":
                raise oom from None
            raise RuntimeError(f"speculators-compat {' '.join(args)} exited with {exc.code}") from None


def metrics(run: Path) -> list[dict]:
    path = run / "train_metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if '"train"' in line]


class RecompileLimitHits:
    """Counts dynamo's "hit config.recompile_limit" warnings: a frame that then runs eagerly."""

    def __init__(self):
        import logging

        self.hits: list[str] = []
        handler = logging.Handler()
        handler.emit = (
            lambda r: self.hits.append(r.getMessage()) if "recompile_limit" in r.getMessage() else None
        )
        logging.getLogger("torch._dynamo").addHandler(handler)


HITS = None


class LoaderWait:
    """Seconds the training loop waits for each batch from its data loader (``__next__`` of
    torch's loader iterators): with ``--num-workers 0`` the whole load, cast and noise; with
    workers, what they did not hide. The GPU's share of a step is what remains of it."""

    def __init__(self):
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self.waits: list[float] = []
        original = _BaseDataLoaderIter.__next__

        def timed(it):
            t0 = time.perf_counter()
            try:
                return original(it)
            finally:
                self.waits.append(time.perf_counter() - t0)

        _BaseDataLoaderIter.__next__ = timed


WAITS = None


class OptimizerTime:
    """Seconds each optimizer step takes (torch's global step hooks; the GPU synchronized before
    and after, so the step's own kernels are what is timed)."""

    def __init__(self):
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.times: list[float] = []
        self._t0 = 0.0
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

        def pre(*_):
            sync()
            self._t0 = time.perf_counter()

        def post(*_):
            sync()
            self.times.append(time.perf_counter() - self._t0)

        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)


OPTIMIZER = None


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def draft_forward_compiled() -> bool:
    from speculators.models.eagle3.core import Eagle3DraftModel

    return hasattr(Eagle3DraftModel.__dict__["forward"], "_torchdynamo_orig_callable")


# -- demo --------------------------------------------------------------------------------------
def demo(carried: Path, work: Path, model: Path | None) -> dict:
    import io
    from contextlib import redirect_stdout

    from speculators_compat.pipeline.layout import RunFolder
    from speculators_compat.tiny import build

    cpu_losses = [m["train"]["loss"] for m in metrics(carried)]
    if not cpu_losses:
        raise SystemExit(f"{carried} holds no train_metrics.jsonl: run `speculators-compat demo` there first")
    run_dir = work / "demo-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(carried, run_dir, ignore=shutil.ignore_patterns("checkpoints", "train_metrics.jsonl"))
    run = RunFolder(run_dir)
    settings = run.settings()
    # the fixture the demo ran (its cache folder is named <recipe>-<dtype>-<key>), built here
    model = model or build(Path(settings["model"]).name.rsplit("-", 2)[0], "float32")
    with run.update() as state:  # the run folder moved to this machine, and so did the verifier
        state["settings"]["model"] = str(model)
        train_facts = state["stages"].pop("train")
    status = io.StringIO()
    with redirect_stdout(status):
        cli("status")
    log(status.getvalue())
    graphs = dynamo_graphs()
    t0 = time.perf_counter()
    # The demo's training options (commands.demo), passed as the demo passes them; loading and
    # precision as on the CPU (no loader workers: the same noise; fp32), to compare like with like.
    cli("train", "--out", str(run_dir), "--quiet", "--epochs", str(train_facts["epochs"]), "--lr", "1e-3",
        "--total-seq-len", "1024", "--num-workers", "0", "--precision", "fp32")  # fmt: skip
    seconds = time.perf_counter() - t0
    gpu_losses = [m["train"]["loss"] for m in metrics(run_dir)]
    n = min(len(cpu_losses), len(gpu_losses))
    diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu_losses[:n], gpu_losses[:n], strict=True)]
    result = {
        "model_seed": settings.get("seed"),
        "steps_cpu": len(cpu_losses),
        "steps_gpu": len(gpu_losses),
        "seconds": round(seconds, 1),
        "dynamo_graphs_compiled": dynamo_graphs() - graphs,
        "recompile_limit_hits": list(HITS.hits),
        # speculators' @torch.compile wrapper, or the eager forward draft_eager_on_cpu puts back
        "draft_forward_compiled": draft_forward_compiled(),
        "status": status.getvalue(),
        "loss_cpu": [round(x, 6) for x in cpu_losses],
        "loss_gpu": [round(x, 6) for x in gpu_losses],
        "rel_diff_first": diffs[0] if diffs else None,
        "rel_diff_max_first10": max(diffs[:10]) if diffs else None,
        "rel_diff_max": max(diffs) if diffs else None,
        "rel_diff_last": diffs[-1] if diffs else None,
    }
    log(
        f"demo on GPU: {len(gpu_losses)} steps in {seconds:.1f} s (CPU run: {len(cpu_losses)} steps); "
        f"draft forward compiled: {result['draft_forward_compiled']}; torch.compile graphs in training: "
        f"{result['dynamo_graphs_compiled']} (flex attention's own included)"
    )
    for i in sorted({0, 1, 2, 5, 10, 20, n // 2, n - 1} & set(range(n))):
        log(f"  step {i:4d}  loss cpu {cpu_losses[i]:.6f}  gpu {gpu_losses[i]:.6f}  rel diff {diffs[i]:.2e}")
    log(
        f"  relative difference: first {diffs[0]:.2e}, max over the first 10 steps "
        f"{result['rel_diff_max_first10']:.2e}, max {result['rel_diff_max']:.2e}, last {diffs[-1]:.2e}"
    )
    return result


# -- kimi --------------------------------------------------------------------------------------
def kimi_verifier(folder: Path, hidden: int | None, vocab: int | None) -> dict:
    """config.json (Kimi-K2.5's), its config class, and the three tensors the draft reads."""
    import torch
    from safetensors.torch import save_file

    from speculators_compat.tiny.kimi import _CONFIGURATION_PY

    config = json.loads(KIMI_CONFIG.read_text())
    config["auto_map"] = {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}
    text = config["text_config"]
    if hidden:  # a CPU dry run of this script only
        text["hidden_size"] = hidden
        text["num_attention_heads"] = text["num_key_value_heads"] = 4
        text["intermediate_size"] = hidden * 2
    if vocab:
        text["vocab_size"] = vocab
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "configuration_kimi_k25.py").write_text(_CONFIGURATION_PY)
    h, v = text["hidden_size"], text["vocab_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(0)
    tensors = {
        f"{PREFIX}model.embed_tokens.weight": torch.randn(
            v, h, generator=g, device=device, dtype=torch.bfloat16
        ),
        f"{PREFIX}lm_head.weight": torch.randn(v, h, generator=g, device=device, dtype=torch.bfloat16) * 0.02,
        f"{PREFIX}model.norm.weight": 1
        + 0.1 * torch.randn(h, generator=g, device=device, dtype=torch.bfloat16),
    }
    save_file(
        {k: t.cpu() for k, t in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"}
    )
    return text


def kimi_pool(folder: Path, text: dict, count: int, min_len: int, max_len: int, seed: int = 0) -> list[int]:
    """``count`` synthetic samples in speculators' format; returns their lengths."""
    import torch

    from speculators_compat.pipeline.samples import sample_record

    folder.mkdir(parents=True, exist_ok=True)
    h, v = text["hidden_size"], text["vocab_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(seed)
    lengths = torch.randint(
        min_len, max_len + 1, (count,), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    for i, n in enumerate(lengths):
        ids = torch.randint(0, v, (n,), generator=g, device=device)
        states = [torch.randn(n, h, generator=g, device=device, dtype=torch.bfloat16).cpu() for _ in range(4)]
        mask = torch.ones(n, dtype=torch.long)
        mask[: n // 4] = 0  # the prompt: no loss
        torch.save(sample_record(ids.cpu(), states, mask), folder / f"pool_{i}.pt")
    return lengths


def kimi_run(work: Path, verifier: Path, pool: Path, lengths: list[int], total_seq_len: int, steps: int,
             draft_vocab: int, vocab: int, layer_ids: list[int]) -> Path:  # fmt: skip
    """A run folder whose prepare/extract/vocab stages are complete: enough samples (links into
    the pool, in turn) for about ``steps`` training steps of ``total_seq_len`` tokens."""
    import numpy as np

    from speculators_compat.pipeline.layout import RunFolder

    mean = statistics.mean(lengths)
    # 90% of the files train (speculators' split); packing fills a batch to ~95%
    count = max(4, round(steps * total_seq_len * 0.95 / mean / 0.9))
    run_dir = work / f"kimi-{total_seq_len}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run = RunFolder(run_dir)
    run.hidden_states.mkdir(parents=True)
    for i in range(count):
        (run.hidden_states / f"data_{i}.pt").symlink_to(pool / f"pool_{i % len(lengths)}.pt")
    (run.hidden_states / "data_config.json").write_text(
        json.dumps({"hidden_states": {"layer_ids": layer_ids}, "synthetic": True})
    )
    run.vocab.mkdir()
    # the draft vocabulary: the first draft_vocab ids (d2t[i] = target id - draft id)
    np.save(run.vocab / "d2t.npy", np.zeros(draft_vocab, dtype=np.int64))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[:draft_vocab] = True
    np.save(run.vocab / "t2d.npy", t2d)
    with run.update() as state:
        state["settings"] = {"model": str(verifier), "seed": 0, "seq_length": max(lengths), "synthetic": True}
        state["stages"] = {
            "prepare": {"samples": count},
            "extract": {"samples": count, "layer_ids": layer_ids},
            "vocab": {"draft_vocab_size": draft_vocab},
        }
    return run_dir


def kimi_train(run_dir: Path, total_seq_len: int, num_workers: int | None, warmup: int, lengths_by_file,
               precision: str | None = None) -> dict:  # fmt: skip
    import torch
    from speculators.train.data import split_files

    cuda = torch.cuda.is_available()  # False: a CPU dry run of this script
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    args = ["--num-workers", str(num_workers)] if num_workers is not None else []
    args += ["--precision", precision] if precision else []
    del WAITS.waits[:]
    del OPTIMIZER.times[:]
    try:
        cli("train", "--out", str(run_dir), "--quiet", "--epochs", "1", "--total-seq-len", str(total_seq_len),
            *args)  # fmt: skip
    except torch.OutOfMemoryError as exc:
        error = str(exc).splitlines()[0]
        return {
            "total_seq_len": total_seq_len,
            "fits": False,
            "error": error,
            "recompile_limit_hits": len(HITS.hits),
        }
    t_end = time.time()
    steps = metrics(run_dir)
    times = [t0] + [m["time"] for m in steps]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    steady = gaps[warmup:] or gaps[-1:]
    # tokens a step trains on: the train split's tokens over its steps (packing included)
    train_files, _ = split_files(str(run_dir / "hidden_states"), ratio=0.9)
    tokens = sum(lengths_by_file(f) for f in train_files)
    step_s = statistics.median(steady)
    # the loader's waits of the training steps (the first len(steps) of the epoch; validation after)
    waits = WAITS.waits[: len(steps)][warmup:]
    wait_s = statistics.median(waits) if waits else None
    facts = json.loads((run_dir / "run.json").read_text())["stages"]["train"]
    result = {
        "total_seq_len": total_seq_len,
        "fits": True,
        "num_workers": facts.get("loader_workers", num_workers),
        "precision": facts.get("precision"),
        "fused_adamw": facts.get("fused_adamw"),
        "loader_wait_s": round(wait_s, 3) if wait_s is not None else None,
        "optimizer_step_s": (
            round(statistics.median(OPTIMIZER.times[warmup:]), 4) if OPTIMIZER.times[warmup:] else None
        ),
        "gpu_share": round(1 - wait_s / step_s, 3) if wait_s is not None else None,
        "steps": len(steps),
        "first_step_s": round(gaps[0], 1),
        "step_s": round(step_s, 3),
        "step_s_spread": [round(min(steady), 3), round(max(steady), 3)],
        "tokens_per_step": round(tokens / max(len(steps), 1)),
        "tokens_per_s": round(tokens / max(len(steps), 1) / step_s),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GB, 1) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GB, 1) if cuda else None,
        "epoch_end_s": round(t_end - times[-1], 1),
        "recompile_limit_hits": len(HITS.hits),
        "loss_first_last": [steps[0]["train"]["loss"], steps[-1]["train"]["loss"]] if steps else None,
        "losses": [round(m["train"]["loss"], 6) for m in steps],
    }
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # ~14 GB each at this size
    return result


def kimi(args, work: Path, save) -> dict:
    verifier = work / "kimi-k25-verifier"
    t0 = time.perf_counter()
    text = kimi_verifier(verifier, args.hidden, args.vocab)
    log(f"verifier (embedding, norm, LM head; hidden {text['hidden_size']}, vocab {text['vocab_size']}) "
        f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    t0 = time.perf_counter()
    pool = work / "pool"
    lengths = kimi_pool(pool, text, args.pool, args.min_len, args.max_len)
    size = sum(p.stat().st_size for p in pool.iterdir())
    log(
        f"{args.pool} synthetic samples, {sum(lengths)} tokens, {size / GB:.1f} GiB "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    n_layers = text["num_hidden_layers"]
    layer_ids = [2, n_layers // 2, n_layers - 3, n_layers - 1]  # speculators' default for this depth

    def length_of(path: str) -> int:
        return lengths[int(Path(path).stem.split("_")[1]) % len(lengths)]

    rows = []
    for total in args.total_seq_lens:
        run_dir = kimi_run(work, verifier, pool, lengths, total, args.steps, args.draft_vocab,
                           text["vocab_size"], layer_ids)  # fmt: skip
        row = kimi_train(run_dir, total, args.num_workers, args.warmup, length_of, args.precision)
        rows.append(row)
        log(json.dumps(row))
        save(partial_rows=rows)
        if not row["fits"]:
            break
    fitting = [r for r in rows if r["fits"]]
    for workers in args.compare_workers:  # the best batch again, its batches loaded by workers
        best = max(fitting, key=lambda r: r["tokens_per_s"])
        run_dir = kimi_run(work, verifier, pool, lengths, best["total_seq_len"], args.steps,
                           args.draft_vocab, text["vocab_size"], layer_ids)  # fmt: skip
        row = kimi_train(run_dir, best["total_seq_len"], workers, args.warmup, length_of, args.precision)
        rows.append(row)
        log(json.dumps(row))
        save(partial_rows=rows)
    fitting = [r for r in rows if r["fits"]]
    best = max(fitting, key=lambda r: r["tokens_per_s"]) if fitting else None
    estimate = None
    if best:
        tokens = 7000 * statistics.mean(lengths)
        estimate = {
            "samples": 7000,
            "mean_sample_tokens": round(statistics.mean(lengths)),
            "gpus": 8,
            "total_seq_len": best["total_seq_len"],
            "hours": round(tokens / (best["tokens_per_s"] * 8) / 3600, 3),
            "assumes": "linear scaling over 8 GPUs (no FSDP2 cost), the synthetic set's mean length",
        }
        log(
            f"one epoch of 7,000 samples on 8 GPUs ~ {estimate['hours'] * 60:.1f} min ({estimate['assumes']})"
        )
    return {
        "hidden": text["hidden_size"],
        "vocab": text["vocab_size"],
        "draft_vocab": args.draft_vocab,
        "lengths": [args.min_len, args.max_len],
        "rows": rows,
        "max_fitting_total_seq_len": max((r["total_seq_len"] for r in fitting), default=None),
        "epoch_estimate": estimate,
    }


def foreach_adamw() -> None:
    """``train`` updates with torch's fused AdamW kernels in tf32 and bf16
    (``pipeline.train.fused_adamw_for``); this variant keeps the foreach kernels speculators 0.3.0's
    ``torch.optim.AdamW(params, lr=...)`` runs on a GPU, to compare."""
    from speculators_compat.pipeline import train

    train.fused_adamw_for = lambda precision: False


def trimmed_padding(multiple: int) -> None:
    """speculators 0.3.0 pads every batch to ``--total-seq-len``; this variant pads it only to
    the next multiple of ``multiple`` tokens past what it packs (fewer tokens of work, more
    distinct shapes for torch.compile)."""
    import speculators.train.data as data

    shipped = data.create_collate_fn

    def create_collate_fn(max_len: int):
        collate = shipped(max_len)

        def trimmed(batch):
            out = collate(batch)
            used = int(out["lengths"].sum())
            keep = min(max_len, -(-used // multiple) * multiple)
            return {k: v if k == "lengths" else v[:, :keep] for k, v in out.items()}

        return trimmed

    data.create_collate_fn = create_collate_fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", type=Path, help="a finished CPU `speculators-compat demo` folder")
    p.add_argument("--demo-model", type=Path, help="its verifier (default: deepseek-v3-tiny built here)")
    p.add_argument("--kimi", action="store_true", help="the Kimi-K2.5-sized draft")
    p.add_argument("--total-seq-lens", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192])
    p.add_argument("--steps", type=int, default=8, help="training steps per batch size (about)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median (compilation)")
    p.add_argument("--num-workers", type=int, default=None, help="default: train's (4 on a GPU)")
    from speculators_compat.pipeline.train import PRECISIONS

    p.add_argument("--precision", choices=PRECISIONS, help="default: train's (tf32 on a GPU)")
    p.add_argument(
        "--foreach-adamw", action="store_true", help="AdamW's foreach kernels, not train's fused (a variant)"
    )
    p.add_argument(
        "--pad-multiple", type=int, default=None, help="pad batches to a multiple of this (a variant)"
    )
    p.add_argument(
        "--compare-workers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[],
        help="then the fastest batch size again with these data loader workers",
    )
    p.add_argument("--pool", type=int, default=16, help="distinct synthetic samples (files link to them)")
    p.add_argument("--min-len", type=int, default=1024)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=None, help=argparse.SUPPRESS)  # CPU dry run
    p.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-train"))
    p.add_argument("--out", type=Path, default=None, help="write gpu_train.json here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import speculators_compat  # noqa: F401  (the documented entry point: activates the shims)

    global HITS, WAITS, OPTIMIZER
    HITS = RecompileLimitHits()
    WAITS = LoaderWait()
    OPTIMIZER = OptimizerTime()

    if args.foreach_adamw:
        foreach_adamw()
    if args.pad_multiple:
        trimmed_padding(args.pad_multiple)
    args.work.mkdir(parents=True, exist_ok=True)
    report = {
        "environment": environment(),
        "foreach_adamw": args.foreach_adamw,
        "pad_multiple": args.pad_multiple,
    }
    log(json.dumps(report["environment"]))

    def save(**partial) -> None:  # after each measurement: a run cut short keeps what it measured
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_train.json").write_text(json.dumps({**report, **partial}, indent=2))

    if args.demo:
        report["demo"] = demo(args.demo.resolve(), args.work, args.demo_model and args.demo_model.resolve())
        save()
    if args.kimi:
        report["kimi"] = kimi(args, args.work, save)
        save()


if __name__ == "__main__":
    main()
