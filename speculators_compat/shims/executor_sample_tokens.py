"""vLLM >= 0.12: ``execute_model`` no longer samples; ``sample_tokens`` must follow it.

speculators 0.3.0 calls ``executor.execute_model(scheduler_output)`` and nothing else. From
vLLM 0.12 that runs the forward pass and returns ``None``; the worker then waits for
``sample_tokens(grammar_output)``, and the next ``execute_model`` fails its state check. The
shim makes the generator's executor call ``sample_tokens(None)`` after an ``execute_model``
that returned ``None`` (no structured output is ever requested), so the caller gets the
``ModelRunnerOutput`` as on 0.11.

Probe: ``MultiprocExecutor`` has a ``sample_tokens`` method.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, compat_executor_class, inherited, module

NAME = "executor_sample_tokens"


def probe() -> bool:
    return hasattr(module(GENERATOR).MultiprocExecutor, "sample_tokens")


def patch():
    cls = compat_executor_class()
    base_execute = inherited(cls, "execute_model")

    def execute_model(self, scheduler_output, *args, **kwargs):
        output = base_execute(self, scheduler_output, *args, **kwargs)
        if output is None:
            output = self.sample_tokens(None)
        return output

    return replace_attr(cls, "execute_model", execute_model, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:MultiprocExecutor.execute_model",
    vllm=">=0.11.1",
    symptom="the second execute_model fails in the worker (RuntimeError: Worker failed with "
    "error 'State error: sample_tokens() must be called after execute_model() returns None.')",
    upstream="speculators PR #225 (vLLM 0.12)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    requires=("generator_executor",),
)
