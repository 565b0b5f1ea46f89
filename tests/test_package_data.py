"""What a wheel holds is what the commands read: every file the package reads at run time lies inside
``hf_rope_ext/`` and matches a ``[tool.setuptools.package-data]`` glob of pyproject.toml, so an install from a wheel
(no checkout beside it) finds it. Checked from the source, without building a wheel (``scripts/check_wheel.sh``
builds and installs one)."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

from hf_rope_ext.publish import cards
from hf_rope_ext.store import bundled

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_rope_ext"


def package_data(pyproject: Path) -> list[tuple[Path, str]]:
    """(package folder, glob) for every entry of ``[tool.setuptools.package-data]``."""
    table = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    return [(pyproject.parent.joinpath(*name.split(".")), glob) for name, globs in table.items() for glob in globs]


def shipped(path: Path, globs: list[tuple[Path, str]]) -> bool:
    """Whether ``path`` is a module of the package or matches one of its package-data globs (setuptools' globs: ``*``
    stays within one folder)."""
    path = path.resolve()
    if path.suffix == ".py":
        return path.is_relative_to(PACKAGE)
    for folder, glob in globs:
        relative = path.relative_to(folder) if path.is_relative_to(folder) else None
        if relative is not None and relative.parts[:-1] == Path(glob).parts[:-1]:
            if fnmatch.fnmatch(relative.name, Path(glob).name):
                return True
    return False


def data_files(root: Path) -> list[Path]:
    """The files of the package that are not Python modules (compiled files left out)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc"))


def reaches_out(path: Path, package: Path) -> list[str]:
    """``line: folder`` for each ``Path(__file__)...`` expression of ``path`` that climbs (``.parent``,
    ``.parents[k]``) above ``package``: a file read from there is not in the wheel."""
    found, depth = [], len(path.relative_to(package.parent).parts) - 1  # folders from the root down to the module's
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        up = levels_up(node)
        if up is not None and up > depth - 1:  # depth - 1 levels up from the module's folder is the package itself
            found.append(f"{path.relative_to(package.parent)}:{node.lineno} climbs {up + 1} levels from the module")
    return found


def levels_up(node: ast.AST) -> int | None:
    """Levels above the module's folder that ``Path(__file__)[.resolve()]`` followed by ``.parent`` / ``.parents[k]``
    reaches (0: the module's folder); None for any other expression."""
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        base, count = node.value, 0
    elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) == "parents":
        if not isinstance(node.slice, ast.Constant):
            return None
        base, count = node.value.value, node.slice.value
    else:
        return None
    inner = levels_up(base)
    if inner is not None:
        return inner + count + 1
    return count if from_file(base) else None


def from_file(node: ast.AST) -> bool:
    """``Path(__file__)``, optionally ``.resolve()`` or ``.absolute()``."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("resolve", "absolute"):
        node = node.func.value
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "Path"
        and len(node.args) == 1
        and getattr(node.args[0], "id", None) == "__file__"
    )


GLOBS = package_data(ROOT / "pyproject.toml")


def test_every_data_file_of_the_package_is_declared():
    missing = [str(p.relative_to(ROOT)) for p in data_files(PACKAGE) if not shipped(p, GLOBS)]
    assert missing == [], f"add these to [tool.setuptools.package-data] in pyproject.toml: {missing}"


def test_no_module_reads_from_above_the_package():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in reaches_out(path, PACKAGE)]
    assert found == [], found


def test_the_files_the_commands_read_ship_with_the_package():
    """The card templates (``extend --out``, ``finetune``, ``export``, ``push``) and the bundled model and corpus list
    (every command's default model and data)."""
    templates = sorted(cards.templates_dir().glob("*.md"))
    assert {p.stem for p in templates} == {"adapter", "export", "extended"}
    model = sorted(bundled.default_model_path().iterdir())
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in model}
    for path in [*templates, *model, bundled.FILE_LIST]:
        assert path.resolve().is_relative_to(PACKAGE) and shipped(path, GLOBS), path


def test_the_checks_find_a_file_left_outside(tmp_path):
    """A template read from the repository root, a data file no glob declares: each is found."""
    package = tmp_path / "hf_rope_ext"
    (package / "publish").mkdir(parents=True)
    module = package / "publish" / "cards.py"
    module.write_text(
        "from pathlib import Path\n"
        "INSIDE = Path(__file__).resolve().parent / 'model_cards'\n"
        "PACKAGE = Path(__file__).parents[1]\n"
        "ROOT = Path(__file__).resolve().parents[2] / 'model_cards'\n"
        "ALSO = Path(__file__).parent.parent.parent / 'model_cards'\n"
    )
    assert reaches_out(module, package) == [
        "hf_rope_ext/publish/cards.py:4 climbs 3 levels from the module",
        "hf_rope_ext/publish/cards.py:5 climbs 3 levels from the module",
    ]
    (package / "publish" / "model_cards").mkdir()
    (package / "publish" / "model_cards" / "a.md").write_text("")
    (package / "publish" / "notes.txt").write_text("")
    globs = [(package / "publish", "model_cards/*.md")]
    assert shipped(package / "publish" / "model_cards" / "a.md", globs)
    assert not shipped(package / "publish" / "notes.txt", globs)
