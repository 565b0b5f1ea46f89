"""``hf-rope-ext list``: every rope type (the package's and transformers' own), its parameters and its level."""

from __future__ import annotations

import json

from .. import load_methods
from ..types.registry import BUILTIN_SUMMARIES, BUILTIN_TYPES, REQUIRED, FromLength, methods, type_spec


def add_parser(subparsers, name):
    parser = subparsers.add_parser(name, help="list every RoPE scaling type with its parameters")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    return parser


def _parameter(default) -> dict:
    """A parameter's default with its JSON type kept (number, boolean, null; a string only where it is derived:
    transformers' "max_position_embeddings", a rule of L0 such as STRING's "L0 // 3") and whether it must be given."""
    if isinstance(default, FromLength):
        return {"default": default.text, "required": False}
    return {"default": None if default is REQUIRED else default, "required": default is REQUIRED}


def static_rows(method) -> list[str]:
    """What a static cache layer keeps turned beside its keys and values for ``method`` (``engine.static_rows``):
    "keys" and "values", each one more tensor of the key (value) cache's size."""
    if method.kind != "attention" or method.dynamic:
        return []
    return [name for name, kept in zip(("keys", "values"), method.attention.kept_turns, strict=True) if kept]


def rows() -> list[dict]:
    """One row per rope type: name, source, level, dynamic, parameters (default, required), the rows a static cache
    keeps turned (``static_rows``), summary.

    Read from the registry and the table of transformers' own types; tests check that it names exactly what
    ``ROPE_INIT_FUNCTIONS`` holds once the package is imported.
    """
    load_methods()
    table = [
        {
            "rope_type": m.name,
            "source": "hf_rope_ext",
            "level": m.kind,
            "dynamic": m.dynamic,
            "parameters": {k: _parameter(p.default) for k, p in type_spec(m.name)[0].items()},
            "static_rows": static_rows(m),
            "summary": m.summary,
        }
        for m in methods()
    ]
    for name, params in BUILTIN_TYPES.items():
        table.append(
            {
                "rope_type": name,
                "source": "transformers",
                "level": "frequency",
                "dynamic": name in ("dynamic", "longrope"),
                "parameters": {k: _parameter(v) for k, v in params.items()},
                "static_rows": [],
                "summary": BUILTIN_SUMMARIES[name],
            }
        )
    return table


def _default_text(spec: dict) -> str:
    if spec["required"]:
        return "required"
    return "-" if spec["default"] is None else str(spec["default"])


def markdown(table: list[dict]) -> str:
    lines = [
        "| rope_type | from | level | parameters (default) | a static cache keeps turned | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for row in table:
        params = ", ".join(f"`{k}` ({_default_text(v)})" for k, v in row["parameters"].items()) or "-"
        level = row["level"] + (", dynamic" if row["dynamic"] else "")
        kept = " and ".join(row["static_rows"]) or "-"
        lines.append(f"| `{row['rope_type']}` | {row['source']} | {level} | {params} | {kept} | {row['summary']} |")
    return "\n".join(lines)


def run(args) -> int:
    table = rows()
    print(json.dumps(table, indent=2) if args.json else markdown(table))
    return 0
