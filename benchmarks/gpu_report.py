"""Gather what ``benchmarks/gpu.sh`` measured in OUT into ``OUT/gpu.json`` and ``OUT/gpu.md``.

    python benchmarks/gpu_report.py OUT

Reads OUT/engines.json (``check_engines.py --json``: errors against the reference engine), OUT/attention.json
(``bench_attention.py --json``), OUT/compiled.json (``bench_compiled_decode.py --json``: compiled decode in a CUDA
graph and compiled ``generate``, with its own table), OUT/finetune.json (``bench_finetune_gpu.py --json``) and,
when present, the JSON files under OUT/passkey/ (``experiments/real_model_report.py --out``); a part not measured is
named as missing in both outputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def attention_table(data: dict) -> list[str]:
    """One row per case: plain's time, then each type's time ratio (min over repeats) / peak ratio."""
    records = data["records"]
    types = list(dict.fromkeys(r["rope_type"] for r in records if r["rope_type"] != "default"))
    cases = list(dict.fromkeys((r["pass"], r["tokens"], r["head_dim"], r["dtype"]) for r in records))
    lines = ["| pass | tokens | head_dim | dtype | plain s | " + " | ".join(types) + " |"]
    lines.append("| --- | ---: | ---: | --- | ---: | " + " | ".join("---:" for _ in types) + " |")
    for case in cases:
        row = {r["rope_type"]: r for r in records if (r["pass"], r["tokens"], r["head_dim"], r["dtype"]) == case}
        cells = [f"{row['default']['time_min_s']:.4f}", *(cell(row.get(t)) for t in types)]
        lines.append("| " + " | ".join([*map(str, case), *cells]) + " |")
    return lines


def kernels_table(data: dict) -> list[str]:
    """One row per case and type: the kernels its call ran (records of bench_attention.py that name them)."""
    records = [r for r in data["records"] if r.get("kernels")]
    lines = ["| pass | tokens | dtype | rope_type | kernels (calls) |", "| --- | ---: | --- | --- | --- |"]
    lines += [f"| {r['pass']} | {r['tokens']} | {r['dtype']} | {r['rope_type']} | {r['kernels']} |" for r in records]
    return lines if records else []


def cell(record: dict | None) -> str:
    if record is None:
        return "-"
    peak = f" / {record['peak_ratio']:.2f}" if record.get("peak_ratio") is not None else ""
    return f"{record['ratio_min']:.2f}{peak}"


def engines_table(data: dict) -> list[str]:
    """One row per type and dtype: the error of each case (FAIL where past its bound)."""
    records = data["records"]
    cases = list(dict.fromkeys(r["case"] for r in records))
    lines = [
        "| rope_type | dtype | " + " | ".join(cases) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in cases) + " |",
    ]
    for key in dict.fromkeys((r["rope_type"], r["dtype"]) for r in records):
        row = {r["case"]: r for r in records if (r["rope_type"], r["dtype"]) == key}
        cells = [f"{row[c]['error']:.1e}" + ("" if row[c]["error"] <= row[c]["bound"] else " FAIL") for c in cases]
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    return lines


def finetune_table(data: dict) -> list[str]:
    lines = ["| shape | kernels | length | tokens/s | MFU | peak GiB | note |", "| --- " * 7 + "|"]
    for r in data["records"]:
        mfu = f"{100 * r['mfu']:.1f}%" if isinstance(r.get("mfu"), float) else ""
        fields = (r.get("shape"), r.get("kernels"), r.get("length"), r.get("tokens_per_s"), mfu, r.get("peak_gib"))
        lines.append("| " + " | ".join("" if v is None else str(v) for v in (*fields, r.get("note"))) + " |")
    return lines


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    parts = {
        "engines": load(out / "engines.json"),
        "attention": load(out / "attention.json"),
        "compiled": load(out / "compiled.json"),
        "finetune": load(out / "finetune.json"),
        "passkey": [load(p) for p in sorted((out / "passkey").glob("*.json"))] or None,
    }
    md = [f"# GPU measurements ({(out / 'device.txt').read_text().strip() if (out / 'device.txt').is_file() else '?'})"]
    if parts["engines"]:
        title = "Fast engine against the reference engine: max |error| / max |reference| (check_engines.py)"
        md += ["", title, "", *engines_table(parts["engines"])]
    if parts["attention"]:
        title = "Attention call, x plain sdpa: time (min over repeats) / peak memory"
        md += ["", title, "", *attention_table(parts["attention"])]
        named = kernels_table(parts["attention"])
        md += ["", "Kernels each attention call ran (the first call of a case)", "", *named] if named else []
    if parts["compiled"]:
        title = "Compiled decode (StaticCache): graphed attention step and generate tokens/s, x plain compiled alike"
        md += ["", title, "", *parts["compiled"]["table"]]
    if parts["finetune"]:
        md += ["", "LoRA fine-tuning", "", *finetune_table(parts["finetune"])]
    if parts["passkey"]:
        md += ["", "Real-model pass key: see passkey/ (experiments/real_model_report.py)"]
    missing = [name for name, value in parts.items() if not value]
    md += ["", f"Not measured: {', '.join(missing)}"] if missing else []
    (out / "gpu.json").write_text(json.dumps({**parts, "missing": missing}, indent=2), encoding="utf-8")
    (out / "gpu.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
