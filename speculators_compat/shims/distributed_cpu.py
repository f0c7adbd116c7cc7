"""CPU: speculators' distributed training path (``torchrun``, FSDP2) on gloo.

speculators 0.3.0 sets distributed training up for accelerators only: ``maybe_setup_distributed``
calls ``torch.accelerator.set_device_index(local_rank)`` (on a CPU-only machine with a CUDA
build of torch: ``RuntimeError: Found no NVIDIA driver on your system``), ``apply_fully_sharded``
lets FSDP2 build its device mesh on the accelerator, and ``Trainer.setup_model`` materialises the
sharded layers with ``to_empty(device="cuda")``. PyTorch's FSDP2 itself runs on CPU with gloo.

On CPU-only machines the shim initialises the process group with gloo, shards on a CPU device
mesh (same mixed-precision policy as speculators: bfloat16 parameters, float32 reductions), and
materialises the layers on the CPU; everything else (the sampler, the trainer loop, the
``DistributedCheckpointer``) is speculators' own code. GPUs keep speculators' path.

Probe: CUDA is not available and ``maybe_setup_distributed`` selects an accelerator device.
"""

from __future__ import annotations

import inspect
import os

from ..shim import Shim, replace_attr, undo_all
from ._targets import TRAIN_UTILS, TRAINER, inherited, module

NAME = "distributed_cpu"


def probe() -> bool:
    import torch

    source = inspect.getsource(module(TRAIN_UTILS).maybe_setup_distributed)
    return not torch.cuda.is_available() and "set_device_index" in source


def maybe_setup_distributed():
    """(local_rank, world_size, rank, is_distributed), with gloo under torchrun."""
    import torch.distributed as dist

    if "LOCAL_RANK" not in os.environ:
        return 0, 1, 0, False
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return int(os.environ["LOCAL_RANK"]), dist.get_world_size(), dist.get_rank(), True


def apply_fully_sharded(model):
    """FSDP2 on a CPU device mesh: each draft decoder layer, then the model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def patch():
    utils, trainer = module(TRAIN_UTILS), module(TRAINER)
    original_setup = inherited(trainer.Trainer, "setup_model")

    def setup_model(self):
        if not self.is_distributed:
            return original_setup(self)
        apply_fully_sharded(self.model)
        if self.resume_from_checkpoint and self.checkpointer.previous_epoch != -1:
            self.checkpointer.load_model_state_dict(self.model)
        return None

    return undo_all(
        [
            replace_attr(utils, "maybe_setup_distributed", maybe_setup_distributed, NAME),
            replace_attr(utils, "apply_fully_sharded", apply_fully_sharded, NAME),
            replace_attr(trainer, "apply_fully_sharded", apply_fully_sharded, NAME),
            replace_attr(trainer.Trainer, "setup_model", setup_model, NAME),
        ]
    )


SHIM = Shim(
    name=NAME,
    target=f"{TRAIN_UTILS}:maybe_setup_distributed, {TRAIN_UTILS}:apply_fully_sharded, "
    f"{TRAINER}:Trainer.setup_model",
    vllm=">=0.11",
    symptom="torchrun on CPU: RuntimeError: Found no NVIDIA driver on your system "
    "(torch.accelerator.set_device_index)",
    upstream="none filed: speculators trains on GPUs",
    remove_when="never on speculators 0.3.x (training on a CPU is ours)",
    hook_module=TRAINER,
    probe=probe,
    patch=patch,
    platform="cpu",
)
