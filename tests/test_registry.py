"""The registry: every shim documented, and patching idempotent and reversible in any order."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from speculators_compat.shims import SHIMS
from tests.helpers import run_python


@pytest.mark.parametrize("shim", SHIMS, ids=lambda s: s.name)
def test_every_shim_names_target_range_symptom_and_test(shim):
    from pathlib import Path

    assert re.fullmatch(r"[a-z0-9_]+", shim.name)
    assert re.match(r"[a-z0-9_.]+:[A-Za-z_.]+", shim.target)
    SpecifierSet(shim.vllm)  # parses
    SpecifierSet(shim.speculators)
    assert len(shim.symptom) > 20
    assert (Path(__file__).parent / "shims" / f"test_{shim.name}.py").is_file()


# Operations on the shim layer, each run in a fresh process, with what they imply.
_OPS = {
    "import_vllm_first": "import vllm.model_executor.layers.layernorm",
    "activate": "speculators_compat.activate()",
    "apply_now": "speculators_compat.apply_now()",
    "unpatch": "speculators_compat.unpatch()",
}

_PROGRAM = """
    import json, os
    os.environ["SPECULATORS_COMPAT_AUTO"] = "0"
    import speculators_compat
    from speculators_compat.registry import MARK
    from speculators_compat.shims import SHIMS
    {ops}
    speculators_compat.apply_now()
    from vllm.model_executor.layers.layernorm import RMSNorm
    f = RMSNorm.__dict__.get("forward_cpu")
    depth = 0
    while f is not None and getattr(f, MARK, None):
        depth += 1
        f = getattr(f, "__wrapped__", None)
    states = {{s.shim.name: s.state for s in speculators_compat.status()}}
    speculators_compat.unpatch()
    print(json.dumps({{"depth": depth, "states": states,
                      "restored": "forward_cpu" not in RMSNorm.__dict__ or
                                  not getattr(RMSNorm.__dict__["forward_cpu"], MARK, None)}}))
"""


@settings(max_examples=4, deadline=None)
@given(st.lists(st.sampled_from(sorted(_OPS)), max_size=5))
def test_patch_unpatch_in_any_order_ends_wrapped_at_most_once_and_restores(ops):
    result = run_python(_PROGRAM.format(ops="\n    ".join(_OPS[o] for o in ops)))
    from speculators_compat.registry import in_range
    from speculators_compat.shims.cpu_rms_norm_strided import SHIM
    from speculators_compat.versions import installed_versions

    expected_depth = 1 if in_range(installed_versions().vllm, SHIM.vllm) else 0
    assert result["depth"] == expected_depth  # wrapped once when needed, never twice
    assert "pending" not in result["states"].values()
    assert result["restored"]


def test_disable_env_leaves_a_shim_out():
    result = run_python(
        """
        import json, speculators_compat
        rows = speculators_compat.apply_now()
        print(json.dumps({r.shim.name: [r.state, r.reason] for r in rows}))
        """,
        env={"SPECULATORS_COMPAT_DISABLE": "cpu_rms_norm_strided"},
    )
    assert result["cpu_rms_norm_strided"][0] == "disabled"
    assert "SPECULATORS_COMPAT_DISABLE" in result["cpu_rms_norm_strided"][1]


@pytest.mark.parametrize(
    ("field", "fake", "expected"),
    [
        ("speculators", "0.4.0", "speculators 0.4.0 (supported: ==0.3.*)"),
        ("vllm", "0.10.2", "vLLM 0.10.2 (supported: >=0.11)"),
    ],
)
def test_unsupported_versions_apply_nothing_and_say_why(field, fake, expected):
    result = run_python(
        f"""
        import json
        from dataclasses import replace
        from packaging.version import Version
        import speculators_compat.versions as v
        fake = replace(v.installed_versions(), {field}=Version("{fake}"))
        v.installed_versions = lambda: fake
        import speculators_compat
        rows = speculators_compat.apply_now()
        print(json.dumps({{r.shim.name: [r.state, r.reason] for r in rows}}))
        """,
        env={"SPECULATORS_COMPAT_AUTO": "0"},
    )
    assert {state for state, _ in result.values()} == {"skipped"}
    assert all(expected in reason for _, reason in result.values())


def test_importing_speculators_first_then_the_package_applies_the_shims():
    result = run_python(
        """
        import json
        import speculators.data_generation.vllm_hidden_states_generator as gen
        original = gen.VllmHiddenStatesGenerator.generate
        import speculators_compat
        print(json.dumps({"replaced": gen.VllmHiddenStatesGenerator.generate is not original,
                          "state": {s.shim.name: s.state for s in speculators_compat.status()}}))
        """
    )
    assert result["replaced"]
    assert result["state"]["token_attribution"] == "applied"


def test_status_command_prints_the_registry_state():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "speculators_compat", "status"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = run_python(
        """
        import json, speculators_compat
        print(json.dumps({r.shim.name: r.state for r in speculators_compat.apply_now()}))
        """
    )
    rows = {line.split()[0]: line.split()[1:3] for line in proc.stdout.splitlines() if line.split()}
    for name, state in expected.items():
        assert " ".join(rows[name])[: len(state)] == state, (name, rows.get(name))


def test_readme_table_lists_every_shim():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for shim in SHIMS:
        assert f"| `{shim.name}` |" in readme, f"README's shim table lacks {shim.name}"
