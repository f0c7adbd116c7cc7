"""The registry: every shim, in the order it is applied. One module per vLLM change point.

| shim | vLLM | what it fixes |
| --- | --- | --- |
| cpu_rms_norm_strided | 0.12-0.13, CPU | wrong DeepSeek states: CPU rms_norm misreads strided views |
| cpu_moe_activation_config | 0.14, CPU | "Current vLLM config is not set" in float32 MoE forward |

Each module defines ``SHIM`` (a :class:`~speculators_compat.registry.Shim`) and its test lives
in ``tests/shims/test_<name>.py``.
"""

from __future__ import annotations

from ..registry import Shim
from . import cpu_moe_activation_config, cpu_rms_norm_strided

SHIMS: list[Shim] = [
    cpu_rms_norm_strided.SHIM,
    cpu_moe_activation_config.SHIM,
]

BY_NAME: dict[str, Shim] = {s.name: s for s in SHIMS}
