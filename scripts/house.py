"""The house in numbers: import cycles, imports inside functions, module sizes (an AST walk, nothing imported).

    python scripts/house.py            # a report; exit status 1 on a cycle, a module over the limit, a reach
                                       # into transformers' internals outside hf_rope_ext/_transformers/, a
                                       # module loose in the package root, a tangle of folders, a dropped
                                       # answer anywhere in the tree or a test module importing another test
                                       # module (the last two below)

Edges: ``import a.b`` and ``from a import b`` (b a module) point to that module, ``from a import name`` to package
``a`` (its ``__init__``); importing a module also points to every package above it that is not above the importer
(Python runs those ``__init__`` files first, so a circle through them is a circle). Imports inside functions count
(they run too), and so do imports under ``if TYPE_CHECKING:`` (a module that names another's types depends on it: a
reader must read both). A cycle is a strongly connected component of more than one module.

The package root holds only ``__init__``, ``__main__`` and ``version`` (``ROOT_MODULES``); everything else lives in
a folder named for what it holds. Folders import each other one way: two folders that reach each other, directly or
through others, are a tangle (a cycle of the graph whose nodes are the package's folders, the root left out).

A dropped answer is a statement that computes a value and throws it away: a check that never runs, such as
``Path(p).exists()`` where ``assert Path(p).exists()`` was meant. ruff's B018 and B015 find bare names, attributes
and comparisons but leave every call alone (a call may be made for its effect), so this finds the calls that are
made only for their answer: the predicates in PREDICATES, and a conditional expression whose branches are all
dropped answers.

A test module imports no other test module (``tests/test_*.py``): what two of them share lives in
``tests/conftest.py`` or a helper module named for what it holds, so that reading one test file never means reading
another, and importing a helper never runs another file's module-level setup.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "hf_rope_ext"
LINE_LIMIT = 300
# calls that only answer a question: a statement that makes one and drops the answer checks nothing
PREDICATES = {
    "exists", "is_file", "is_dir", "is_symlink", "startswith", "endswith", "isinstance", "issubclass", "hasattr",
    "callable", "issubset", "issuperset", "isdisjoint", "all", "any", "equal", "allclose", "isclose", "isfinite",
    "isnan", "isinf", "is_tensor", "is_available",
}  # fmt: skip
ROOT_MODULES = ("__init__", "__main__", "version")  # all the package root holds besides its folders
SKIPPED_DIRS = {".git", "runs", "build"}  # and every environment: a folder named .venv*


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package under ``root``."""
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def resolve(name: str, level: int, current: str, is_package: bool) -> str:
    """The absolute module a (relative) import names."""
    if level == 0:
        return name
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def function_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside function bodies."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno"))
    return lines


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported module of the package, whether the import sits inside a function) for each import of ``name``."""
    tree = ast.parse(path.read_text())
    inside = function_lines(tree)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.module or "", node.level, name, is_package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        inner = node.lineno in inside
        found += [(m, inner) for t in targets if t in known for m in with_packages(t, name, known) if m != name]
    return found


def with_packages(target: str, importer: str, known) -> list[str]:
    """``target`` and the packages above it whose ``__init__`` runs first, except those above the importer."""
    parts = target.split(".")
    above = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    packages = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [target] + [p for p in packages if p in known and p not in above]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


SEAMS = f"{PACKAGE}._transformers"


INTERNAL_MODULES = ("transformers.models.auto.",)  # helpers of the auto classes, not an extension point


def transformers_names(tree: ast.AST) -> tuple[list[str], set[str]]:
    """(private or internal names imported from transformers, local names bound to something of transformers,
    also through plain aliases such as ``cls = module.Class``)."""
    private, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers" and not node.level:
            parts = node.module.split(".") + [a.name for a in node.names]
            internal = (node.module + ".").startswith(INTERNAL_MODULES)
            private += [f"{node.module}:{a.name}" for a in node.names if internal or any(p[:1] == "_" for p in parts)]
            bound |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):  # aliases: names assigned from something bound (one level is what the code does)
        if isinstance(node, ast.Assign) and rooted_in(node.value, bound):
            bound |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    return private, bound


def rooted_in(value: ast.AST, bound: set[str]) -> bool:
    """Whether ``value`` is a name or attribute chain (or a tuple of them) starting at a bound name."""
    if isinstance(value, ast.Tuple):
        return any(rooted_in(v, bound) for v in value.elts)
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name) and value.id in bound


def reaches(name: str, path: Path) -> list[str]:
    """What a module outside the seams does to transformers that only a seam may: import private names, or set
    attributes of (or on) something imported from transformers."""
    if name == SEAMS or name.startswith(SEAMS + "."):
        return []
    tree = ast.parse(path.read_text())
    private, bound = transformers_names(tree)
    found = [f"{name} imports {p}" for p in private]
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) in bound:
                found.append(f"{name}:{node.lineno} sets {target.value.id}.{target.attr}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            if getattr(node.args[0], "id", None) in bound:
                found.append(f"{name}:{node.lineno} setattr on {node.args[0].id}")
    return found


def folder_of(name: str, known: dict[str, Path]) -> str | None:
    """The top folder of the package that module ``name`` lies in; None for the root's own modules."""
    parts = name.split(".")
    if len(parts) > 2 or (len(parts) == 2 and known[name].name == "__init__.py"):
        return parts[1]
    return None


def loose_in_root(known: dict[str, Path]) -> list[str]:
    """Modules in the package root besides ROOT_MODULES."""
    return sorted(
        n for n in known if n.count(".") == 1 and folder_of(n, known) is None and n.split(".")[1] not in ROOT_MODULES
    )


def folder_tangles(graph: dict[str, set[str]], known: dict[str, Path]) -> list[list[str]]:
    """Cycles of the folder graph: folder A -> B when a module in A imports one in B."""
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        a = folder_of(name, known)
        if a is not None:
            folders.setdefault(a, set()).update(b for t in targets if (b := folder_of(t, known)) not in (None, a))
    return sorted(strongly_connected({f: folders.get(f, set()) for f in sorted(set(folders).union(*folders.values()))}))


def dropped(value: ast.expr) -> bool:
    """True when an expression statement of ``value`` computes an answer and throws it away."""
    if isinstance(value, ast.Call):
        func = value.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in PREDICATES
    if isinstance(value, ast.IfExp):  # `a() if c else b()` runs a() or b(): dropped only if both are
        return dropped(value.body) and dropped(value.orelse)
    return not isinstance(value, (ast.Constant, ast.Await, ast.Yield, ast.YieldFrom))  # docstrings, `...`, yields


def dropped_answers(root: Path) -> list[str]:
    """``path:line`` of every statement in the tree's Python files that drops an answer (see the module docstring)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if any(part in SKIPPED_DIRS or part.startswith(".venv") for part in path.relative_to(root).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Expr) and dropped(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno} drops {ast.unparse(node.value)[:60]}")
    return found


def tests_importing_tests(root: Path) -> list[str]:
    """``path:line imports name`` for every import in a ``tests/test_*.py`` of another ``tests/test_*.py`` module
    (``import test_x``, ``from test_x import ...``, ``from tests.test_x import ...``, ``from tests import test_x``)."""
    paths = sorted((root / "tests").rglob("test_*.py"))
    names, found = {path.stem for path in paths}, []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                dotted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                dotted = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            hits = sorted({part for d in dotted for part in d.split(".") if part in names and part != path.stem})
            found += [f"{path.relative_to(root)}:{node.lineno} imports {hit}" for hit in hits]
    return found


def report(root: Path, top_level_only: bool = False) -> dict:
    """Cycles, imports inside functions, modules over LINE_LIMIT lines and reaches past the seams of the package under
    ``root``; the dropped answers of every Python file under it; the test modules that import another."""
    known = modules(root)
    graph, inside = {m: set() for m in known}, []
    for name, path in known.items():
        for target, in_function in imports(name, path, known):
            if in_function:
                inside.append((name, target))
            if not (top_level_only and in_function):
                graph[name].add(target)
    sizes = {name: len(path.read_text().splitlines()) for name, path in known.items()}
    large = sorted(((n, s) for n, s in sizes.items() if s > LINE_LIMIT), key=lambda x: -x[1])
    reach = [r for name, path in known.items() for r in reaches(name, path)]
    found = {"cycles": strongly_connected(graph), "inside_functions": inside, "large": large, "reach": reach}
    layout = {"loose": loose_in_root(known), "tangles": folder_tangles(graph, known)}
    return {**found, **layout, "dropped": dropped_answers(root), "test_imports": tests_importing_tests(root)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--top-level-only", action="store_true", help="leave imports inside functions out")
    args = parser.parse_args(argv)
    found = report(args.root, args.top_level_only)
    for component in found["cycles"]:
        print(f"cycle of {len(component)} modules: {' '.join(component)}")
    print(f"import cycles: {len(found['cycles'])}")
    print(f"imports of the package's own modules inside functions: {len(found['inside_functions'])}")
    for name, size in found["large"]:
        print(f"over {LINE_LIMIT} lines: {name} ({size})")
    for line in found["reach"]:
        print(f"outside the seams: {line}")
    for name in found["loose"]:
        print(f"loose in the package root: {name}")
    for folders in found["tangles"]:
        print(f"folders that import each other: {' '.join(folders)}")
    for line in found["dropped"]:
        print(f"a dropped answer: {line}")
    for line in found["test_imports"]:
        print(f"a test module importing another: {line}")
    failed = ("cycles", "large", "reach", "loose", "tangles", "dropped", "test_imports")
    return 1 if any(found[key] for key in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
