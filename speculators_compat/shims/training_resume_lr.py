"""speculators 0.3.0 (every vLLM, CPU and GPU): the first step after a resume trains at the wrong
learning rate.

Resuming, ``Trainer.setup_optimizer`` loads the optimizer's state, then builds the LR scheduler
with ``last_epoch=checkpointer.previous_epoch``, an epoch index where the scheduler counts steps:
building it writes the schedule's rate for that "step" (step 1 after the first epoch) into the
optimizer, and ``load_scheduler_state_dict`` restores the scheduler's own step count and last
rate without writing that rate back. The first step after the resume trains at the wrong rate
(the test: 7.5e-4 where the schedule stood at 5.0e-4: lr 1e-3, 2 epochs of 2 steps); the next
``scheduler.step()`` puts the schedule right again. No error; one step per resume.

Probe: ``setup_optimizer`` passes ``previous_epoch`` as ``last_epoch`` and loads the scheduler's
state (its source). The shim, after ``setup_optimizer`` on a resumed run, sets each parameter
group's rate to the restored scheduler's last rate.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ._targets import TRAINER, module

NAME = "training_resume_lr"


def probe() -> bool:
    source = inspect.getsource(module(TRAINER).Trainer.setup_optimizer)
    return "last_epoch = self.checkpointer.previous_epoch" in source and "load_scheduler_state_dict" in source


def patch():
    trainer = module(TRAINER).Trainer
    original = trainer.setup_optimizer

    def setup_optimizer(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None and self.resume_from_checkpoint and self.checkpointer.previous_epoch != -1:
            for group, lr in zip(self.opt.param_groups, scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
        return result

    return replace_attr(trainer, "setup_optimizer", setup_optimizer, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{TRAINER}:Trainer.setup_optimizer",
    vllm=">=0.11",
    symptom="no error: the first training step after a resume runs at the schedule's rate for "
    "step 1, not where the schedule stood (7.5e-4 instead of 5.0e-4 in the test)",
    upstream="speculators PR #411 (the optimizer resume bug)",
    remove_when="speculators 0.5.0",
    hook_module=TRAINER,
    probe=probe,
    patch=patch,
)
