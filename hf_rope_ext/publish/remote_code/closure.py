"""Which modules of a package its ``__init__`` can import: the closure of its relative imports, read statically.

Every relative ``import`` statement counts, also those inside functions (``install()`` imports the method
packages lazily), so the result is a deterministic superset of what ``import <package>`` executes.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_closure(package_dir: Path) -> dict[str, Path]:
    """Dotted name inside the package ("" for the top ``__init__``) -> source file, for every reachable module."""
    found: dict[str, Path] = {}
    pending = [""]
    while pending:
        name = pending.pop()
        path = module_file(package_dir, name)
        if name in found or path is None:
            continue
        found[name] = path
        pending.extend(_parents(name) + imported_modules(package_dir, name, path))
    return dict(sorted(found.items()))


def module_file(package_dir: Path, name: str) -> Path | None:
    base = package_dir.joinpath(*name.split(".")) if name else package_dir
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def imported_modules(package_dir: Path, name: str, path: Path) -> list[str]:
    """Package modules named by the relative imports of ``name`` (``from .x import y``: x, and x.y if a module)."""
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == package_dir.name
        ):
            raise ValueError(f"{path} imports {node.module!r} absolutely; only relative imports can be vendored")
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            parts = name.split(".") if name else []
            anchor = parts if is_package else parts[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            target = ".".join(anchor + (node.module.split(".") if node.module else []))
            names.append(target)
            names += [f"{target}.{a.name}" if target else a.name for a in node.names]
    return [n for n in names if module_file(package_dir, n) is not None]


def _parents(name: str) -> list[str]:
    parts = name.split(".") if name else []
    return [".".join(parts[:i]) for i in range(len(parts))]
