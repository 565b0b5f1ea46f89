"""``hf-rope-ext list``: every rope type (the package's and transformers' own), its parameters and its level."""

from __future__ import annotations

import json


def add_parser(subparsers, name):
    parser = subparsers.add_parser(name, help="list every RoPE scaling type with its parameters")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    return parser


def _format_default(value) -> str:
    from ..registry import REQUIRED

    if value is REQUIRED:
        return "required"
    return "-" if value is None else str(value)


def rows() -> list[dict]:
    """One row per rope type: name, source, level, parameters with defaults, summary."""
    from ..registry import BUILTIN_SUMMARIES, BUILTIN_TYPES, methods

    table = [
        {
            "rope_type": m.name,
            "source": "hf_rope_ext",
            "level": m.kind + (", dynamic" if m.dynamic else ""),
            "parameters": {k: _format_default(p.default) for k, p in m.params.items()},
            "summary": m.summary,
        }
        for m in methods()
    ]
    for name, params in BUILTIN_TYPES.items():
        level = "frequency, dynamic" if name in ("dynamic", "longrope") else "frequency"
        table.append(
            {
                "rope_type": name,
                "source": "transformers",
                "level": level,
                "parameters": {k: _format_default(v) for k, v in params.items()},
                "summary": BUILTIN_SUMMARIES[name],
            }
        )
    return table


def markdown(table: list[dict]) -> str:
    lines = ["| rope_type | from | level | parameters (default) | what it does |", "|---|---|---|---|---|"]
    for row in table:
        params = ", ".join(f"`{k}` ({v})" for k, v in row["parameters"].items()) or "-"
        lines.append(f"| `{row['rope_type']}` | {row['source']} | {row['level']} | {params} | {row['summary']} |")
    return "\n".join(lines)


def run(args) -> int:
    import hf_rope_ext  # noqa: F401  (registers the types)

    table = rows()
    print(json.dumps(table, indent=2) if args.json else markdown(table))
    return 0
