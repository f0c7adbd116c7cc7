"""speculators 0.3.0 (every vLLM, CPU and GPU): after a resume the metric step starts at 0 again.

``Trainer.setup_trainer`` finds the last checkpoint, sets ``current_epoch`` past it and then
``global_step = 0`` whether it resumed or not. Every metric record carries that step
(``extra={"step": ...}``), so a resumed run logs its second epoch at steps 0, 1, ... again:
TensorBoard, Weights & Biases and Trackio draw it over the first epoch's curve, and
``train_metrics.jsonl`` repeats the first epoch's step numbers. No error.

Probe: ``setup_trainer`` sets ``global_step = 0`` after it reads ``current_epoch`` (its source).
The shim, after ``setup_trainer`` on a resumed run, sets ``global_step`` to the steps the
finished epochs took (``current_epoch`` times the loader's batches per epoch, as the scheduler
counts them).
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ._targets import TRAINER, module

NAME = "training_resume_step"


def probe() -> bool:
    source = inspect.getsource(module(TRAINER).Trainer.setup_trainer)
    return (
        "self.global_step = 0" in source
        and "self.current_epoch = self.checkpointer.previous_epoch + 1" in source
    )


def patch():
    trainer = module(TRAINER).Trainer
    original = trainer.setup_trainer

    def setup_trainer(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if self.resume_from_checkpoint and self.current_epoch > 0 and self.global_step == 0:
            self.global_step = self.current_epoch * len(self.train_loader)
        return result

    return replace_attr(trainer, "setup_trainer", setup_trainer, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{TRAINER}:Trainer.setup_trainer",
    vllm=">=0.11",
    symptom="no error: a resumed run logs its metrics from step 0 again (its epoch drawn over the "
    "first in TensorBoard; train_metrics.jsonl repeats the step numbers)",
    upstream="none filed",
    remove_when="never on speculators 0.3.x (a 0.3.0 bug)",
    hook_module=TRAINER,
    probe=probe,
    patch=patch,
)
