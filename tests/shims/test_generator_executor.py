"""generator_executor: the executor shims never touch vLLM's own MultiprocExecutor."""

from __future__ import annotations

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from speculators_compat.shim import MARK
from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.generator_executor import SHIM


def test_generator_gets_a_subclass_and_vllms_class_stays_clean(state):
    assert state(SHIM) == "applied"
    compat = module(GENERATOR).MultiprocExecutor
    assert compat is not MultiprocExecutor and issubclass(compat, MultiprocExecutor)
    for name in ("execute_model", "collective_rpc"):
        assert not getattr(vars(MultiprocExecutor)[name], MARK, None)
