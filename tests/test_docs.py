"""The generated parts of the docs match what they are generated from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from speculators_compat.shim import markdown_table
from speculators_compat.shims import SHIMS

ROOT = Path(__file__).resolve().parents[1]


def test_the_shim_table_in_the_docs_is_the_registry():
    text = (ROOT / "docs" / "shims.md").read_text()
    block = re.search(r"<!-- shim table: [^\n]*-->\n(.*?)<!-- end shim table -->", text, re.DOTALL)
    assert block, "docs/shims.md lost its generated block"
    assert block.group(1) == markdown_table(SHIMS), "docs/shims.md is out of date: python tools/docs.py"
    for shim in SHIMS:
        assert f"| `{shim.name}` |" in block.group(1)


def test_every_shim_says_where_it_came_from_and_when_it_goes():
    """``upstream`` names an issue or PR (``#N``) or says why there is none; ``remove_when`` names
    a release or says "never" and why; a shim whose vLLM range ends names that release."""
    for shim in SHIMS:
        assert re.search(r"#\d+", shim.upstream) or shim.upstream.startswith("none"), shim
        assert re.search(r"\b\d+\.\d+", shim.remove_when) or shim.remove_when.startswith("never"), shim
        end = re.search(r"<\s*(\d+\.\d+)", shim.vllm)
        if end:
            assert f"vLLM {end.group(1)}" in shim.remove_when, shim


def test_status_markdown_prints_the_table_and_applies_nothing():
    code = (
        "import sys; from speculators_compat.cli import main; "
        "sys.argv = ['speculators-compat', 'status', '--markdown']; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"SPECULATORS_COMPAT_AUTO": "0", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == markdown_table(SHIMS)


def test_the_docs_links_resolve():
    """Every relative link in README.md and docs/*.md names a file that exists."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to {target}"
