"""The capture path at a real model's width: states moved from the worker to the driver and
written as ``data_{i}.pt``, fed synthetic states.

On the tiny fixtures a token's states are 2 KB, and the model decides how fast extraction goes.
Kimi-K2.5 captures 4 layers of hidden size 7,168 in bfloat16: 57 KB a token, and 8xH200
prefilling at 20-50k tokens/s produce 1-3 GB/s of states. There the transfer and the writer
decide. This benchmark runs the same code a real extraction runs, on synthetic states:

- worker: :class:`speculators_compat.capture.CaptureState`'s forward hooks (on identity layers,
  fed the states), ``end_step`` filing each step's rows under their request, ``take_packed``;
- transfer: vLLM's ``MessageQueue``, the queue a worker answers ``collective_rpc`` through
  (``MultiprocExecutor``'s ``worker_response_mq``), between two processes;
- driver: :func:`speculators_compat.capture.unpack_states`, then extract's sample
  (``pipeline.samples.sample_record``) written with ``atomic.write_file`` + ``torch.save``.

Each batch shape runs in fresh processes (peak memory is per process). Printed: seconds and GB/s
per stage, end to end, each process's peak RSS against the batch's bytes, and the machine's
bounds measured in the same run: copying the batch once in memory, and writing it to the same
disk (``torch.save`` of one tensor, then the same with ``fsync``).

    python benchmarks/capture_width.py [--hidden 7168] [--layers 4] [--batches 1x32768,8x4096,1x4096]
                                       [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, header, run_child

GB = 1e9
STEP_TOKENS = 8192  # tokens per scheduler step (chunked prefill splits a long sample over steps)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _worker(conn, hidden: int, layers: int, lengths: list[int], repeat: int = 1) -> None:
    """The worker's side: capture by hooks, step by step, pack, answer through the queue."""
    import torch
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    from speculators_compat.capture import CaptureState

    queue = MessageQueue(1, 1)  # as MultiprocExecutor's WorkerProc builds its response queue
    conn.send(queue.export_handle())
    queue.wait_until_ready()
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(layers))
    state = CaptureState(model, list(range(layers)))
    base = rss_bytes()
    # synthetic states; each layer's output of each step is a tensor of its own, as the model's is
    rows = torch.randn(STEP_TOKENS, hidden, dtype=torch.bfloat16)
    for batch in range(repeat):
        if repeat > 1:
            conn.recv()  # as extract's generate() call: the worker computes when the driver asks
        req_ids = [f"req-{batch}-{i}" for i in range(len(lengths))]
        filing = 0.0  # the hooks and end_step, not the making of the rows (the model's part)
        for req_id, n in zip(req_ids, lengths, strict=True):
            for offset in range(0, n, STEP_TOKENS):
                count = min(STEP_TOKENS, n - offset)
                outputs = [rows[:count].clone() for _ in model.layers]
                start = time.perf_counter()
                for layer, output in zip(model.layers, outputs, strict=True):
                    layer(output)
                state.end_step([req_id], {req_id: count})
                filing += time.perf_counter() - start
                del outputs
        start = time.perf_counter()
        packed = state.take_packed(req_ids)
        taken = time.perf_counter()
        queue.enqueue(packed)
        sent = time.perf_counter()
        del packed
        if repeat == 1:
            conn.send({"file": filing, "pack": taken - start, "enqueue": sent - taken, "sent_at": sent})
    conn.send({"peak_rss": peak_rss_bytes(), "base_rss": base})


def child(hidden: int, layers: int, lengths: list[int], out: Path) -> None:
    """The driver's side (a fresh process): start the worker, receive, unpack, write."""
    import multiprocessing

    import torch

    from speculators_compat.capture import unpack_states
    from speculators_compat.pipeline.atomic import write_file
    from speculators_compat.pipeline.samples import sample_record

    ctx = multiprocessing.get_context("spawn")  # vLLM's CPU workers are spawned
    parent_conn, worker_conn = ctx.Pipe()
    worker = ctx.Process(target=_worker, args=(worker_conn, hidden, layers, lengths))
    worker.start()
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue.create_from_handle(parent_conn.recv(), 0)
    queue.wait_until_ready()
    base = rss_bytes()
    t0 = time.perf_counter()
    packed = queue.dequeue()
    received = time.perf_counter()
    worker_times = parent_conn.recv()
    by_request = unpack_states(packed)
    del packed
    unpacked = time.perf_counter()
    nbytes = 0
    for i, (req_id, n) in enumerate(zip(list(by_request), lengths, strict=True)):
        ids = torch.zeros(n, dtype=torch.long)
        sample = sample_record(ids, by_request.pop(req_id), torch.ones(n, dtype=torch.long))
        nbytes += sum(h.nbytes for h in sample["hidden_states"])
        write_file(out / f"data_{i}.pt", lambda tmp, s=sample: torch.save(s, tmp))
        del sample
    written = time.perf_counter()
    worker_rss = parent_conn.recv()
    worker.join()
    emit(
        {
            "bytes": nbytes,
            "worker": worker_times,
            "transfer": received - worker_times["sent_at"] + worker_times["enqueue"],
            "dequeue_wait": received - t0,
            "unpack": unpacked - received,
            "write": written - unpacked,
            "driver_peak": peak_rss_bytes() - base,
            "worker_peak": worker_rss["peak_rss"] - worker_rss["base_rss"],
        }
    )


def overlap_child(
    hidden: int, layers: int, lengths: list[int], out: Path, repeat: int, overlap: bool
) -> None:
    """``repeat`` batches end to end, as extract runs them: the driver receives and unpacks each
    batch, then writes it in series, or (``overlap``) hands it to extract's ``BatchWriter``,
    which writes it on a thread while the next batch arrives."""
    import multiprocessing

    import torch

    from speculators_compat.capture import unpack_states
    from speculators_compat.pipeline.samples import BatchWriter, write_batch

    ctx = multiprocessing.get_context("spawn")
    parent_conn, worker_conn = ctx.Pipe()
    worker = ctx.Process(target=_worker, args=(worker_conn, hidden, layers, lengths, repeat))
    worker.start()
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue.create_from_handle(parent_conn.recv(), 0)
    queue.wait_until_ready()
    writer = BatchWriter()
    nbytes, index = 0, 0
    start = time.perf_counter()
    for _ in range(repeat):
        parent_conn.send("next")  # generate(): the worker runs the batch while we wait
        by_request = unpack_states(queue.dequeue())
        chunk = list(range(index, index + len(lengths)))
        index += len(lengths)
        rows = [{"loss_mask": torch.ones(n, dtype=torch.long)} for n in lengths]
        results = [
            {"input_ids": torch.zeros(n, dtype=torch.long), "hidden_states": states}
            for n, states in zip(lengths, by_request.values(), strict=True)
        ]
        nbytes += sum(h.nbytes for r in results for h in r["hidden_states"])
        if overlap:
            writer.submit(lambda c=chunk, r=rows, res=results: write_batch(out, c, r, res))
        else:
            write_batch(out, chunk, rows, results)
        del by_request, results
    writer.finish()
    elapsed = time.perf_counter() - start
    writer.close()
    parent_conn.recv()
    worker.join()
    emit({"bytes": nbytes, "seconds": elapsed})


def bounds_child(nbytes: int, out: Path) -> None:
    """One copy of ``nbytes`` in memory; ``torch.save`` of them to ``out``, with and without fsync."""
    import torch

    data = torch.empty(nbytes // 2, dtype=torch.bfloat16).normal_()
    start = time.perf_counter()
    data.clone()
    copied = time.perf_counter()
    torch.save(data, out / "bound.pt")
    saved = time.perf_counter()
    with open(out / "bound-fsync.pt", "wb") as f:
        torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    synced = time.perf_counter()
    emit({"copy": copied - start, "save": saved - copied, "save_fsync": synced - saved})


def parse_batches(text: str) -> list[list[int]]:
    """``8x4096,1x32768`` -> [[4096] * 8, [32768]]."""
    batches = []
    for part in text.split(","):
        count, length = part.lower().split("x")
        batches.append([int(length)] * int(count))
    return batches


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / GB / seconds:6.2f} GB/s" if seconds > 0 else "   inf"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=7168, help="hidden size (Kimi-K2.5: 7168)")
    parser.add_argument("--layers", type=int, default=4, help="captured layers (3 auxiliary + the last)")
    parser.add_argument("--batches", default="1x32768,8x4096,1x4096", help="COUNTxTOKENS,... one run each")
    parser.add_argument("--out", type=Path, help="where the data_*.pt files go (default: a temporary folder)")
    parser.add_argument(
        "--overlap",
        type=int,
        default=0,
        metavar="N",
        help="also run N batches of the last shape end to end, written in series and then as "
        "extract writes them (on a thread, while the next batch arrives); prints the ratio",
    )
    parser.add_argument("--child", choices=["path", "bounds", "series", "overlap"], help=argparse.SUPPRESS)
    parser.add_argument("--lengths", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "path":
        return child(args.hidden, args.layers, [int(n) for n in args.lengths.split(",")], args.out)
    if args.child == "bounds":
        return bounds_child(int(args.lengths), args.out)
    if args.child in ("series", "overlap"):
        lengths = [int(n) for n in args.lengths.split(",")]
        return overlap_child(
            args.hidden, args.layers, lengths, args.out, args.overlap, args.child == "overlap"
        )

    header(
        f"capture path at real width: {args.layers} layers x hidden {args.hidden}, bfloat16 "
        f"({args.layers * args.hidden * 2 / 1000:.0f} KB a token)",
        ">= 3 GB/s end to end, or the bound named; peak memory independent of sample length",
    )
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(dir=args.out) as folder:
        out = Path(folder)
        results = []
        for lengths in parse_batches(args.batches):
            for stale in out.glob("*.pt"):
                stale.unlink()
            r = run_child(
                [me, "--child", "path", "--hidden", str(args.hidden), "--layers", str(args.layers),
                 "--lengths", ",".join(map(str, lengths)), "--out", str(out)]
            )  # fmt: skip
            results.append((lengths, r))
        largest = max(r["bytes"] for _, r in results)
        b = run_child([me, "--child", "bounds", "--lengths", str(largest), "--out", str(out)])
        overlapped = {}
        for mode in ("series", "overlap") if args.overlap else ():
            for stale in out.glob("*.pt"):
                stale.unlink()
            overlapped[mode] = run_child(
                [me, "--child", mode, "--hidden", str(args.hidden), "--layers", str(args.layers),
                 "--lengths", ",".join(map(str, lengths)), "--out", str(out), "--overlap", str(args.overlap)]
            )  # fmt: skip
    print(f"   out: {args.out or tempfile.gettempdir()} ({os.statvfs(out.parent).f_bsize}-byte blocks)")
    for lengths, r in results:
        n = r["bytes"]
        w = r["worker"]
        total = w["file"] + w["pack"] + r["transfer"] + r["unpack"] + r["write"]
        shape = f"{len(lengths)} x {lengths[0]:,} tokens" if len(set(lengths)) == 1 else f"{lengths}"
        print(f"   {shape}: {n / GB:.2f} GB of states")
        for stage, seconds in [
            ("worker: hooks + end_step (file rows)", w["file"]),
            ("worker: take_packed", w["pack"]),
            ("transfer: MessageQueue, worker -> driver", r["transfer"]),
            ("driver: unpack_states", r["unpack"]),
            ("driver: sample + write_file(torch.save)", r["write"]),
        ]:
            print(f"     {stage:<44} {seconds:7.2f} s  {rate(n, seconds)}")
        print(f"     {'end to end':<44} {total:7.2f} s  {rate(n, total)}")
        print(
            f"     peak RSS above the process's own: worker {r['worker_peak'] / GB:.2f} GB "
            f"({r['worker_peak'] / n:.1f} x the batch), driver {r['driver_peak'] / GB:.2f} GB "
            f"({r['driver_peak'] / n:.1f} x)"
        )
    print(f"   bounds, {largest / GB:.2f} GB: one copy in memory {rate(largest, b['copy'])}; "
          f"torch.save to this disk {rate(largest, b['save'])} (page cache), "
          f"{rate(largest, b['save_fsync'])} with fsync")  # fmt: skip
    if overlapped:
        s, o = overlapped["series"], overlapped["overlap"]
        print(f"   {args.overlap} batches of {len(lengths)} x {lengths[0]:,} tokens "
              f"({s['bytes'] / GB:.2f} GB), driver end to end: written in series {s['seconds']:.2f} s "
              f"({rate(s['bytes'], s['seconds'])}), by extract's BatchWriter {o['seconds']:.2f} s "
              f"({rate(o['bytes'], o['seconds'])}): ratio {s['seconds'] / o['seconds']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
