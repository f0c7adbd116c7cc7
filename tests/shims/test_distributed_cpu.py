"""distributed_cpu: speculators' distributed setup under torchrun on CPU (gloo). The full
training run with 2 ranks is tests/test_pipeline.py::test_torchrun_two_processes_on_cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speculators_compat.shims.distributed_cpu import SHIM

pytestmark = [pytest.mark.training, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only shim")]

SCRIPT = """
import json, os, sys, speculators_compat
import speculators.train.trainer
from speculators.train.utils import maybe_setup_distributed
import torch.distributed as dist
try:
    result = {"ok": True, "setup": list(maybe_setup_distributed())}
    dist.barrier()
    dist.destroy_process_group()
except Exception as exc:
    result = {"ok": False, "error": str(exc)[:500]}
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w").write(json.dumps(result))
"""


def _torchrun(tmp_path: Path, disable: str) -> list[dict]:
    import json

    script = tmp_path / "setup.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        # --standalone: a free port, not 29500 (another test worker may run torchrun at the same time)
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
        # the script lives in tmp_path: put the checkout first, as pytest does for itself
        env={
            **os.environ,
            "SPECULATORS_COMPAT_DISABLE": disable,
            "PYTHONPATH": str(Path(__file__).parents[2]),
        },
    )
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    for p in tmp_path.glob("rank*.json"):
        p.unlink()
    assert len(results) == 2, proc.stderr[-3000:]
    return results


def test_distributed_setup_on_cpu(tmp_path):
    results = _torchrun(tmp_path, "")
    assert sorted(r["setup"][2] for r in results) == [0, 1] and all(r["setup"][1] == 2 for r in results)
    without = _torchrun(tmp_path, SHIM.name)
    assert without and all(not r["ok"] and "Found no NVIDIA driver" in r["error"] for r in without)
