"""The transformers releases pyproject.toml admits: ``--oldest-pin`` prints ``transformers==<lower bound>``, and with
``--package lm-eval`` the lower bound of the [eval] extra's lm-eval (``lm-eval[ruler]==<lower bound>``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def lower_bound(path: Path = PYPROJECT, package: str = "transformers") -> str:
    """The version after ``>=`` in the project's requirement of ``package`` (read as text: Python 3.10 has no
    tomllib)."""
    found = re.search(rf'"{re.escape(package)}(\[[^\]]*\])?\s*>=\s*([0-9][0-9.]*)', path.read_text())
    if found is None:
        raise SystemExit(f"{path}: no {package} requirement with a lower bound (>=)")
    return found.group(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--oldest-pin", action="store_true", help="print transformers==<lower bound>")
    parser.add_argument("--package", default="transformers", choices=("transformers", "lm-eval"))
    args = parser.parse_args()
    extras = "[ruler]" if args.package == "lm-eval" else ""
    print(f"{args.package}{extras}=={lower_bound(package=args.package)}")


if __name__ == "__main__":
    main()
