"""kv_cache_utils_moved: speculators' generator imports three names that vLLM 0.33 moved from
``kv_cache_utils`` to ``kv_cache_planning``. Runs where a vLLM >= 0.33 is installed: no CPU build
has the move, so CI's ``api-vllm0.34`` env (the CUDA wheel, read on a CPU) runs it; on the CPU
builds ``test_claims`` checks that the probe finds nothing."""

from __future__ import annotations

import os

from speculators_compat.registry import DISABLE_ENV
from speculators_compat.shims._targets import GENERATOR
from speculators_compat.shims.kv_cache_utils_moved import NAMES, PLANNING, SHIM, UTILS
from tests.helpers import fresh, needs_claim, run_python


def test_without_the_shim_the_generator_does_not_import(claimed):
    needs_claim(claimed, SHIM)
    # every other shim on (speculators 0.3.0 needs config_dtype_annotation to import at all
    # under vLLM 0.33's transformers 5)
    env = {**os.environ, DISABLE_ENV: SHIM.name}
    proc = fresh(["-c", f"import speculators_compat\nimport {GENERATOR}"], env=env)
    assert proc.returncode != 0
    assert SHIM.symptom in proc.stderr, proc.stderr[-3000:]


def test_with_the_shim_it_imports_vllms_own_functions_and_unpatch_removes_them(claimed):
    needs_claim(claimed, SHIM)
    result = run_python(
        f"""
        import json
        import speculators_compat
        import {GENERATOR} as generator
        import {UTILS} as utils, {PLANNING} as planning
        names = {NAMES!r}
        # get_kv_cache_config_from_groups is wrapped again by kv_cache_config_specs
        own = lambda f: getattr(f, '__wrapped__', f)
        same = all(own(getattr(generator, n)) is getattr(planning, n) for n in names)
        speculators_compat.unpatch()
        gone = not any(hasattr(utils, n) for n in names)
        speculators_compat.apply_now()
        back = all(getattr(utils, n) is getattr(planning, n) for n in names)
        print(json.dumps({{"same": same, "gone": gone, "back": back}}))
        """
    )
    assert result == {"same": True, "gone": True, "back": True}
