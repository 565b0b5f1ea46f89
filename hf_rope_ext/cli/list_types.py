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


def _method_row(m) -> dict:
    return {
        "rope_type": m.name,
        "source": "hf_rope_ext",
        "level": m.kind + (", dynamic" if m.dynamic else ""),
        "parameters": {k: _format_default(p.default) for k, p in m.params.items()},
        "summary": m.summary,
    }


def _builtin_row(name: str) -> dict:
    """transformers' own type; one this package has no notes on (a newer transformers) is listed all the same."""
    from ..registry import BUILTIN_SUMMARIES, BUILTIN_TYPES

    return {
        "rope_type": name,
        "source": "transformers",
        "level": "frequency, dynamic" if name in ("dynamic", "longrope") else "frequency",
        "parameters": {k: _format_default(v) for k, v in BUILTIN_TYPES.get(name, {}).items()},
        "summary": BUILTIN_SUMMARIES.get(name, "transformers' own type (see its documentation)"),
    }


def rows() -> list[dict]:
    """One row per rope type transformers resolves (the package's first, sorted): name, source, level,
    parameters with defaults, summary. Read from ``ROPE_INIT_FUNCTIONS`` itself, checked against the registry."""
    from .._transformers import rope_types

    found = rope_types()
    ours = sorted((m for _, m in found if m is not None), key=lambda m: m.name)
    return [_method_row(m) for m in ours] + [_builtin_row(name) for name, m in found if m is None]


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
