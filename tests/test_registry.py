"""The registry: every shim documented, and patching idempotent and reversible in any order."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from speculators_compat.shims import SHIMS
from tests.helpers import fresh, run_python


@pytest.mark.parametrize("shim", SHIMS, ids=lambda s: s.name)
def test_every_shim_names_target_range_symptom_and_test(shim):
    from pathlib import Path

    assert re.fullmatch(r"[a-z0-9_]+", shim.name)
    assert re.match(r"[a-z0-9_.]+:[A-Za-z_.]+", shim.target)
    SpecifierSet(shim.vllm)  # parses
    SpecifierSet(shim.speculators)
    assert len(shim.symptom) > 20
    assert (Path(__file__).parent / "shims" / f"test_{shim.name}.py").is_file()


def test_adding_a_shim_is_its_module_its_test_and_one_registry_line():
    """Every module in shims/ is registered (name = module name, one SHIM each), and every test
    file in tests/shims/ named after a shim has one: nothing is half added."""
    from pathlib import Path

    import speculators_compat.shims as package

    modules = {p.stem for p in Path(package.__file__).parent.glob("*.py") if not p.stem.startswith("_")}
    names = [shim.name for shim in SHIMS]
    assert len(names) == len(set(names))
    assert set(names) == modules, "a module in shims/ is not in SHIMS, or SHIMS names no module"
    for shim in SHIMS:
        assert shim.hook_module and getattr(package, shim.name).SHIM is shim


def _owners() -> dict[str, object]:
    """Every module and class a shim's target names, and the objects on the way to it (the
    generator's ``torch.cuda``, ``MultiprocExecutor``), by dotted path."""
    import importlib

    owners: dict[str, object] = {}
    for shim in SHIMS:
        for module_name, attrs in re.findall(r"([\w.]+):([\w.]+)", shim.target):
            try:
                owner = importlib.import_module(module_name)
            except ModuleNotFoundError:  # not in this release (the shim is "not needed" here)
                continue
            owners[module_name] = owner
            path = module_name
            for attr in attrs.split(".")[:-1]:
                owner, path = getattr(owner, attr, None), f"{path}:{attr}"
                if owner is None:
                    break
                owners[path] = owner
    return owners


def _snapshot(owners: dict[str, object]) -> dict[tuple[str, str], object]:
    """(owner, attribute) -> the object bound there, for every attribute of every owner."""
    return {(path, name): value for path, owner in owners.items() for name, value in vars(owner).items()}


def _marks(value) -> list[str]:
    """The shims that wrapped ``value``, outermost first (its ``__wrapped__`` chain)."""
    from speculators_compat.shim import MARK

    marks, seen = [], set()
    while value is not None and id(value) not in seen:
        seen.add(id(value))
        if isinstance(getattr(value, MARK, None), str):
            marks.append(getattr(value, MARK))
        value = getattr(value, "__wrapped__", None)
    return marks


_MISSING = object()

# Operations on the shim layer, in this process (its registry is active, as after the import).
_OPS = {
    "activate": lambda sc: sc.activate(),
    "apply_now": lambda sc: sc.apply_now(),
    "unpatch": lambda sc: sc.unpatch(),
}


@pytest.fixture(scope="module")
def original_bindings():
    """What every target's owner binds with every shim undone, and what apply_now applies."""
    import speculators_compat

    applied = {s.shim.name: s.state for s in speculators_compat.apply_now()}
    owners = _owners()
    speculators_compat.unpatch()
    original = _snapshot(owners)
    speculators_compat.apply_now()
    return owners, original, applied


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(sorted(_OPS)), max_size=6))
def test_patch_unpatch_in_any_order_wraps_each_target_at_most_once_and_restores(original_bindings, ops):
    """Over every shim this release applies (not one chosen shim, which may not apply here)."""
    import speculators_compat

    owners, original, applied = original_bindings
    for op in ops:
        _OPS[op](speculators_compat)
    rows = speculators_compat.apply_now()
    assert {s.shim.name: s.state for s in rows} == applied  # the same shims, whatever came before
    patched = _snapshot(owners)
    changed = _differences(patched, original)
    assert changed or "applied" not in applied.values()
    for key in changed:
        marks = _marks(patched[key])
        assert len(marks) == len(set(marks)), f"{key} wrapped twice by one shim: {marks}"
    speculators_compat.unpatch()
    assert _differences(_snapshot(owners), original) == []  # every binding is the original object
    speculators_compat.apply_now()


def _differences(now: dict, before: dict) -> list:
    """The bindings that are not the same object in both snapshots."""
    keys = now.keys() | before.keys()
    return sorted(key for key in keys if now.get(key, _MISSING) is not before.get(key, _MISSING))


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
    proc = fresh(["-m", "speculators_compat", "status"], timeout=300)
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


def test_status_on_a_machine_without_vllm_reports_instead_of_crashing():
    """A machine that only trains (torch and speculators, no vLLM: the GPU box of issue 15)
    imports speculators' generator module, which imports vLLM. ``status`` there used to end in
    ``ModuleNotFoundError: No module named 'vllm.config'``; it reports the vLLM shims as having
    nothing to patch and resolves the training shims by their probes.

    A plain subprocess, not a fork: the fork server has imported vLLM already."""
    code = "import sys; sys.modules['vllm'] = None; from speculators_compat.cli import main; main(['status'])"
    proc = fresh(["-c", code], fork=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("vLLM not installed, speculators 0.3"), proc.stdout[:300]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    assert "not needed" in rows["generator_executor"]
    assert "vllm is not installed here" in rows["generator_executor"]
    for name in ("draft_verifier_wrapper", "training_target_final_norm", "draft_from_pretrained"):
        assert " applied " in rows[name], rows[name]
        assert "(vLLM is not installed)" in rows[name]
