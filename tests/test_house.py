"""The house rules, read from the source (``scripts/house.py``): no import cycles (imports inside functions, under
``if TYPE_CHECKING:`` and through package ``__init__`` files count), no module loose in the package root, no two
folders importing each other, no module over 300 lines, transformers' internals reached only from the seams in
``hf_rope_ext/_transformers/``; no statement anywhere in the tree that drops a predicate's answer (a check that never
runs); no test module importing another test module (shared helpers live in ``tests/conftest.py`` or a helper
module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("house", ROOT / "scripts" / "house.py")
house = importlib.util.module_from_spec(spec)
spec.loader.exec_module(house)


def test_the_package_has_no_cycle_no_large_module_and_no_reach_past_the_seams():
    found = house.report(ROOT)
    assert found["cycles"] == [] and found["large"] == [] and found["reach"] == [], found
    assert found["loose"] == [] and found["tangles"] == [], (found["loose"], found["tangles"])
    assert found["dropped"] == [], found["dropped"]
    assert found["test_imports"] == [], found["test_imports"]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name if name.startswith("tests/") else root / "hf_rope_ext" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_find_what_they_look_for(tmp_path):
    """A circle through a package __init__ and a function-level import, one through a TYPE_CHECKING import, a
    patched transformers class, a long
    module, checks that never run, test modules importing another: each is reported; a call made for its effect and
    a test module importing a helper module are not."""
    write(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "from . import x\n",
            "a/x.py": "from ..b import y\n",
            "b/__init__.py": "",
            "b/y.py": "def f():\n    from ..a import x\n",
            "c/__init__.py": "",
            "c/z.py": "from ..d import w\n",
            "d/__init__.py": "",
            "d/w.py": "def g():\n    from ..c import q\n",
            "c/q.py": "",
            "e/__init__.py": "",
            "e/p.py": "from .r import R\n",
            "e/r.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .p import P\n",
            "version.py": "",
            "patch.py": "from transformers import GenerationMixin\n\nGenerationMixin.generate = None\n",
            "long.py": "x = 1\n" * 301,
            "tests/test_x.py": (
                '"""Doc."""\nfrom pathlib import Path\n\n\ndef test():\n    p = Path(".")\n    p.exists()\n'
                "    p.mkdir() if p.is_dir() else p.touch()\n    p.is_dir() if p else p.is_file()\n    p.name\n"
            ),
            "tests/helper.py": "import test_x\n",
            "tests/test_y.py": "import conftest\nimport helper\nfrom test_x import test\n\n\ndef f():\n"
            "    import tests.test_x\n",
            "tests/test_z.py": "from tests import test_y\nfrom . import test_x as x, conftest\n",
        },
    )
    found = house.report(tmp_path)
    assert found["cycles"] == [
        ["hf_rope_ext.a", "hf_rope_ext.a.x", "hf_rope_ext.b.y"],
        ["hf_rope_ext.e.p", "hf_rope_ext.e.r"],
    ], found["cycles"]
    assert found["large"] == [("hf_rope_ext.long", 301)]
    assert found["loose"] == ["hf_rope_ext.long", "hf_rope_ext.patch"]  # version.py is allowed
    assert found["tangles"] == [["a", "b"], ["c", "d"]]  # c and d: no cycle of modules, a cycle of folders
    assert found["reach"] == ["hf_rope_ext.patch:3 sets GenerationMixin.generate"]
    assert found["dropped"] == [
        "tests/test_x.py:7 drops p.exists()",
        "tests/test_x.py:9 drops p.is_dir() if p else p.is_file()",
        "tests/test_x.py:10 drops p.name",
    ]
    assert found["test_imports"] == [
        "tests/test_y.py:3 imports test_x",
        "tests/test_y.py:7 imports test_x",
        "tests/test_z.py:1 imports test_y",
        "tests/test_z.py:2 imports test_x",
    ]
