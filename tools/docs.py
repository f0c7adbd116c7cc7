"""Rewrite the generated parts of docs/: the shim table in docs/shims.md (from the registry).

python tools/docs.py          # rewrite
python tools/docs.py --check  # exit 1 if the committed copy differs (tests/test_docs.py)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIMS_DOC = ROOT / "docs" / "shims.md"
BLOCK = re.compile(r"(<!-- shim table: [^\n]*-->\n)(.*?)(<!-- end shim table -->)", re.DOTALL)


def rendered(text: str) -> str:
    os.environ.setdefault("SPECULATORS_COMPAT_AUTO", "0")  # read the records, apply nothing
    from speculators_compat.shim import markdown_table
    from speculators_compat.shims import SHIMS

    if not BLOCK.search(text):
        raise SystemExit(f"{SHIMS_DOC}: no `<!-- shim table: ... -->` block")
    return BLOCK.sub(lambda m: m.group(1) + markdown_table(SHIMS) + m.group(3), text)


def main(argv: list[str]) -> int:
    text = SHIMS_DOC.read_text()
    new = rendered(text)
    if "--check" in argv:
        if new != text:
            print(f"{SHIMS_DOC} is out of date: run `python tools/docs.py`")
            return 1
        return 0
    SHIMS_DOC.write_text(new)
    print(f"wrote {SHIMS_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
