"""Peak resident memory of ``speculators-compat extract`` over 100 and over 1,000 sequences.

States stream to disk batch by batch, so the peak must not grow with the dataset. Each run:
``prepare`` (not measured), then ``extract`` in its own process tree, sampled every 50 ms with
psutil: the CLI process (the driver, which receives the states) and its vLLM worker processes.

    python benchmarks/memory.py [--model deepseek-v3-tiny] [--sizes 100,1000,3000] [--seq-length 512]

The worker's peak depends on glibc's allocator (arenas, trimming): set MALLOC_ARENA_MAX=1
MALLOC_TRIM_THRESHOLD_=65536 to see the retained memory without allocator slack.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import child_env, fixture, header

CLI = [sys.executable, "-m", "speculators_compat"]


def peak_rss(args: list[str], env: dict) -> dict:
    import psutil

    proc = psutil.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_driver = peak_workers = peak_total = 0
    start = time.perf_counter()
    while proc.poll() is None:
        try:
            driver = proc.memory_info().rss
            workers = 0
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    workers += child.memory_info().rss
        except psutil.Error:
            break
        peak_driver = max(peak_driver, driver)
        peak_workers = max(peak_workers, workers)
        peak_total = max(peak_total, driver + workers)
        time.sleep(0.05)
    stderr = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{stderr[-4000:]}")
    return {
        "driver": peak_driver,
        "workers": peak_workers,
        "total": peak_total,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="deepseek-v3-tiny")
    parser.add_argument("--sizes", default="100,1000,3000")
    parser.add_argument("--seq-length", type=int, default=512)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    header(
        f"peak memory of extract ({args.model}, float32, up to {args.seq_length} tokens per sequence)",
        f"peak RSS at {sizes[1]} sequences within 10% of the peak at {sizes[0]}",
    )
    path = fixture(args.model)
    env = child_env()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        # The same conversations at every size (the smallest set, repeated): the sizes then differ
        # in the number of sequences only, not in the longest sequence (which sets a batch's peak).
        base = Path(tmp) / "base.jsonl"
        subprocess.run(
            [*CLI, "fixtures", "chat", "-n", str(min(sizes)), "--out", str(base)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        rows = [line for line in base.read_text().splitlines() if line.strip()]
        for n in sizes:
            chat = Path(tmp) / f"chat-{n}.jsonl"
            chat.write_text("\n".join(rows[i % len(rows)] for i in range(n)) + "\n")
            run = Path(tmp) / f"run-{n}"
            subprocess.run(
                [
                    *CLI,
                    "prepare",
                    "--out",
                    str(run),
                    "--model",
                    str(path),
                    "--data",
                    str(chat),
                    "--max-samples",
                    str(n),
                    "--seq-length",
                    str(args.seq_length),
                    "--quiet",
                ],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            results[n] = r = peak_rss(
                [*CLI, "extract", "--out", str(run), "--dtype", "float32", "--quiet"], env
            )
            files = len(list((run / "hidden_states").glob("data_*.pt")))
            disk = sum(p.stat().st_size for p in (run / "hidden_states").glob("data_*.pt"))
            if files != n:
                raise SystemExit(f"extract wrote {files} files for {n} sequences")
            print(
                f"   {n:>5} sequences: peak RSS driver {r['driver'] / 2**20:7.0f} MiB, workers "
                f"{r['workers'] / 2**20:7.0f} MiB, together {r['total'] / 2**20:7.0f} MiB; "
                f"{r['seconds']:.0f} s; {disk / 2**20:.0f} MiB of states written"
            )
    first, second = results[sizes[0]], results[sizes[1]]
    ratio = second["total"] / first["total"]
    print(
        f"   RATIO {ratio:.2f} (driver alone {second['driver'] / first['driver']:.2f}) for "
        f"{sizes[1] // sizes[0]}x the sequences: " + ("meets the goal" if ratio <= 1.1 else "MISSES the goal")
    )
    if len(sizes) > 2:
        last, before = results[sizes[-1]], results[sizes[-2]]
        print(
            f"   growth from {sizes[-2]} to {sizes[-1]} sequences: {last['total'] / before['total']:.2f}x "
            f"(workers {last['workers'] / before['workers']:.2f}x, "
            f"driver {last['driver'] / before['driver']:.2f}x)"
        )


if __name__ == "__main__":
    sys.exit(main())
