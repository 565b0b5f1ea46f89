"""Rewrite the tables of the docs that are generated from the package, so they stay what the code says.

    python scripts/docs_tables.py          # rewrites docs/methods.md's table of rope types (`hf-rope-ext list`'s)
    python scripts/docs_tables.py --check  # exit status 1 if it is out of date (tests/test_docs.py checks it too)

The table sits between ``<!-- types:start ... -->`` and ``<!-- types:end -->``; README's and the results pages' tables
of figures come from the records: ``experiments/results_at_a_glance.py``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "methods.md"
BLOCK = re.compile(r"(<!-- types:start[^>]*-->\n)(.*?)(\n<!-- types:end -->)", re.S)


def types_table() -> str:
    sys.path.insert(0, str(ROOT))
    from hf_rope_ext.cli.list_types import markdown, rows

    return markdown(rows())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit status 1 when out of date")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    new = BLOCK.sub(lambda m: m.group(1) + types_table() + m.group(3), text, count=1)
    if args.check:
        print("up to date" if new == text else f"{PAGE.relative_to(ROOT)}: the table of rope types is out of date")
        return int(new != text)
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
