"""The pipeline's ``train`` under ``torchrun`` on several GPUs (issue 16): the Kimi-K2.5-sized
draft with speculators 0.3.0's FSDP2 path over NCCL; step time, tokens/s per GPU and peak memory
per GPU, and a resume after one rank is killed mid-epoch.

Needs what benchmarks/gpu_train.py needs (torch with CUDA, speculators 0.3.0, transformers 4.57;
no vLLM) and builds the same verifier (Kimi-K2.5's real config; embedding, final norm and LM head
at 7,168 x 163,840, random, made on the machine) and synthetic hidden-state files. Everything goes
through the documented entry point, ``torchrun --nproc_per_node N -m speculators_compat train``.

1. scaling: one run of ``--epochs`` epochs; from rank 0's ``train_metrics.jsonl``: the median step
   after ``--warmup``, tokens a step over all ranks, tokens/s per GPU; peak ``memory.used`` per GPU
   (nvidia-smi, polled each second); with ``--single gpu_train.json`` (benchmarks/gpu_train.py's
   output at the same ``--total-seq-len``), the scaling efficiency (tokens/s per GPU here over the
   single GPU's); the first and last losses beside the single run's.
2. resume (``--kill-rank R``): a fresh run of 2 epochs; once rank 0 has logged ``--kill-after``
   steps of the second epoch, rank R is killed (SIGKILL); torchrun ends the others. The same
   command again resumes from the first epoch's checkpoint. Checked: the second launch logs no step
   of the first epoch (nothing trained twice) and logs the whole second epoch again; the final
   checkpoint exists.

Keep NVLink multicast off (the device notes say why): ``NCCL_NVLS_ENABLE=0`` is set for the ranks.

    python benchmarks/gpu_train_multi.py --ranks 2 [--total-seq-len 8192] [--steps 12] [--warmup 4]
        [--epochs 1] [--precision fp32|tf32|bf16] [--num-workers N] [--kill-rank 1 --kill-after 3]
        [--single gpu_train.json] [--work DIR] [--out DIR]

A CPU dry run (gloo; the distributed_cpu shim) checks the script itself: add
``--hidden 64 --vocab 512 --draft-vocab 256 --min-len 64 --max-len 256 --total-seq-len 512``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_train  # noqa: E402  (the verifier, the synthetic pool and the run folder)

ROOT = gpu_train.ROOT
log = gpu_train.log


class MemoryPoll:
    """Peak ``memory.used`` (MiB) per GPU while a run lasts, from nvidia-smi each second."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                return  # no nvidia-smi: a CPU dry run
            for line in out.strip().splitlines():
                index, used = (int(x) for x in line.split(","))
                self.peak[index] = max(self.peak.get(index, 0), used)
            self._stop.wait(1.0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)


def torchrun(args, run_dir: Path, epochs: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.ranks),
        "-m", "speculators_compat", "train", "--out", str(run_dir), "--quiet", "--epochs", str(epochs),
        "--total-seq-len", str(args.total_seq_len),
    ]  # fmt: skip
    command += ["--precision", args.precision] if args.precision else []
    command += ["--num-workers", str(args.num_workers)] if args.num_workers is not None else []
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}
    logfile = open(run_dir / f"torchrun-{int(time.time())}.log", "w")  # noqa: SIM115 (lives with the run)
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=logfile, stderr=subprocess.STDOUT)


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the worker whose LOCAL_RANK is ``rank`` among ``parent``'s descendants."""
    children = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    todo, seen = [parent], []
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            seen.append(child)
            todo.append(child)
    for pid in seen:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LOCAL_RANK={rank}".encode() in environ:
            return pid
    return None


def new_run(args, verifier: Path, pool: Path, lengths: list[int], text: dict, layer_ids: list[int]) -> Path:
    """A run folder of about ``--steps`` steps over all ranks (each step takes a batch per rank)."""
    steps = args.steps * args.ranks
    return gpu_train.kimi_run(args.work, verifier, pool, lengths, args.total_seq_len, steps,
                              args.draft_vocab, text["vocab_size"], layer_ids)  # fmt: skip


def scaling(args, verifier: Path, pool: Path, lengths: list[int], text: dict, layer_ids: list[int]) -> dict:
    run_dir = new_run(args, verifier, pool, lengths, text, layer_ids)
    t0 = time.time()
    with MemoryPoll() as memory:
        proc = torchrun(args, run_dir, args.epochs)
        code = proc.wait()
    t_end = time.time()
    steps = gpu_train.metrics(run_dir)
    facts = json.loads((run_dir / "run.json").read_text())["stages"].get("train", {})
    row = {"ranks": args.ranks, "total_seq_len": args.total_seq_len, "exit_code": code, "steps": len(steps),
           "precision": facts.get("precision"), "num_workers": facts.get("loader_workers")}  # fmt: skip
    if code != 0 or not steps:
        row["log_tail"] = sorted(run_dir.glob("torchrun-*.log"))[-1].read_text()[-3000:]
        return row
    times = [t0] + [m["time"] for m in steps]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    steady = gaps[args.warmup :] or gaps[-1:]
    from speculators.train.data import split_files

    train_files, _ = split_files(str(run_dir / "hidden_states"), ratio=0.9)
    tokens = sum(lengths[int(Path(f).stem.split("_")[1]) % len(lengths)] for f in train_files) * args.epochs
    step_s = statistics.median(steady)
    per_step = tokens / len(steps)
    row.update(
        first_step_s=round(gaps[0], 1),
        step_s=round(step_s, 3),
        step_s_spread=[round(min(steady), 3), round(max(steady), 3)],
        tokens_per_step_all_ranks=round(per_step),
        tokens_per_s_per_gpu=round(per_step / step_s / args.ranks),
        peak_memory_used_mib=memory.peak or None,
        end_s=round(t_end - times[-1], 1),
        loss_first_last=[steps[0]["train"]["loss"], steps[-1]["train"]["loss"]],
        losses=[round(m["train"]["loss"], 6) for m in steps],
    )
    if args.single:
        single = json.loads(args.single.read_text())
        rows = single.get("kimi", {}).get("rows") or single.get("partial_rows") or []
        same = [r for r in rows if r.get("fits") and r["total_seq_len"] == args.total_seq_len]
        if same:
            row["single_gpu_tokens_per_s"] = same[0]["tokens_per_s"]
            row["scaling_efficiency"] = round(row["tokens_per_s_per_gpu"] / same[0]["tokens_per_s"], 3)
            row["single_gpu_loss_first_last"] = same[0]["loss_first_last"]
    gpu_train.shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return row


def resume(args, verifier: Path, pool: Path, lengths: list[int], text: dict, layer_ids: list[int]) -> dict:
    run_dir = new_run(args, verifier, pool, lengths, text, layer_ids)
    proc = torchrun(args, run_dir, 2)
    killed = None
    while proc.poll() is None:
        second = [m for m in gpu_train.metrics(run_dir) if m.get("epoch") == 1]
        if killed is None and len(second) >= args.kill_after:
            pid = rank_pid(proc.pid, args.kill_rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = {"rank": args.kill_rank, "pid": pid, "after_steps_of_epoch_1": len(second)}
        time.sleep(0.5)
    first_launch = gpu_train.metrics(run_dir)
    result = {"first_exit_code": proc.returncode, "killed": killed, "steps_logged_first": len(first_launch)}
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir()) if killed else []
    result["checkpoints_after_kill"] = checkpoints
    code = torchrun(args, run_dir, 2).wait()
    again = gpu_train.metrics(run_dir)[len(first_launch) :]
    epoch0 = [m for m in first_launch if m.get("epoch") == 0]
    result.update(
        second_exit_code=code,
        steps_logged_second=len(again),
        second_launch_epochs=sorted({m.get("epoch") for m in again}),
        nothing_trained_twice=bool(again) and all(m.get("epoch") == 1 for m in again),
        second_epoch_complete=len(again) == len(epoch0),
        final_checkpoint=(run_dir / "checkpoints" / "1").is_dir(),
    )
    gpu_train.shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument("--steps", type=int, default=12, help="steps per epoch (about; all ranks together)")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the median (compilation)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--kill-rank", type=int, default=None, help="also run the resume check, killing this rank")
    p.add_argument("--kill-after", type=int, default=3, help="steps of the second epoch before the kill")
    p.add_argument("--single", type=Path, default=None, help="benchmarks/gpu_train.py's gpu_train.json")
    from speculators_compat.pipeline.train import PRECISIONS

    p.add_argument("--precision", choices=PRECISIONS, help="default: train's (tf32 on a GPU)")
    p.add_argument("--num-workers", type=int, default=None, help="default: train's (4 on a GPU)")
    p.add_argument("--pool", type=int, default=16)
    p.add_argument("--min-len", type=int, default=1024)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=None, help=argparse.SUPPRESS)  # CPU dry run
    p.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-train-multi"))
    p.add_argument("--out", type=Path, default=None, help="write gpu_train_multi.json here")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict = {"environment": gpu_train.environment(), "command": sys.argv}

    def save():
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_train_multi.json").write_text(json.dumps(report, indent=1))

    verifier = args.work / "kimi-k25-verifier"
    text = gpu_train.kimi_verifier(verifier, args.hidden, args.vocab)
    pool = args.work / "pool"
    lengths = gpu_train.kimi_pool(pool, text, args.pool, args.min_len, args.max_len)
    n_layers = text["num_hidden_layers"]
    layer_ids = [2, n_layers // 2, n_layers - 3, n_layers - 1]
    log(
        f"verifier hidden {text['hidden_size']}, vocab {text['vocab_size']}; "
        f"{args.pool} samples, {sum(lengths)} tokens"
    )
    report["scaling"] = scaling(args, verifier, pool, lengths, text, layer_ids)
    log(json.dumps(report["scaling"]))
    save()
    if args.kill_rank is not None:
        report["resume"] = resume(args, verifier, pool, lengths, text, layer_ids)
        log(json.dumps(report["resume"]))
        save()


if __name__ == "__main__":
    main()
