"""train's dynamo limit (what failed only on CUDA: issue 15), proven on the CPU with dynamo itself.

On a GPU speculators compiles the draft; its decoder-layer frames are compiled again for each
test-time-training step, grad mode and packing, and past dynamo's recompile limit (8) they run
eagerly and flex attention runs out of memory. Here a frame whose guards change with every call
(a new static shape each time) shows the same limit with dynamo's own counting backend: 8
compilations outside ``draft_compile_limits()``, every variant inside it, and 8 again after."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.pipeline.train import DRAFT_RECOMPILE_LIMIT, draft_compile_limits

VARIANTS = 12


def compilations() -> int:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    layer = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend=counter, dynamic=False)
    for n in range(1, VARIANTS + 1):
        layer(torch.ones(n))  # a new shape: the frame's guards fail, dynamo compiles it again
    return counter.frame_count


@pytest.mark.training
def test_training_lets_dynamo_compile_a_frame_more_than_eight_times():
    default = torch._dynamo.config.recompile_limit
    assert default < VARIANTS <= DRAFT_RECOMPILE_LIMIT
    assert compilations() == default  # the rest ran eagerly: what ran flex attention unfused
    with draft_compile_limits():
        assert compilations() == VARIANTS
    assert torch._dynamo.config.recompile_limit == default
    assert compilations() == default
