"""The transformers releases pyproject.toml admits: ``--oldest-pin`` prints ``transformers==<lower bound>``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def lower_bound(path: Path = PYPROJECT) -> str:
    """The version after ``>=`` in the project's transformers requirement (read as text: Python 3.10 has no
    tomllib)."""
    found = re.search(r'"transformers\s*>=\s*([0-9][0-9.]*)', path.read_text())
    if found is None:
        raise SystemExit(f"{path}: no transformers requirement with a lower bound (>=)")
    return found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--oldest-pin", action="store_true", help="print transformers==<lower bound>")
    parser.parse_args()
    print(f"transformers=={lower_bound()}")


if __name__ == "__main__":
    main()
