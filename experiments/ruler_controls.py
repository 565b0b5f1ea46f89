"""RULER's controls on SmolLM2-135M-Instruct: the model as saved at 4k and 8k (half and all of its training length),
`niah_single_1` and `niah_multikey_2`, 10 samples each, its prompts as plain text and through its chat template.
They tell whether a zero at longer lengths is the model's or the set-up's.

    M=$(hf-rope-ext get-smollm2)
    for t in plain chat; do
      hf-rope-ext eval --model $M --ruler niah_single_1,niah_multikey_2 --lengths 4096,8192 --limit 10 \\
        --max-gen-toks 32 --dtype float32 --report-dir runs/ruler-$t $([ $t = chat ] && echo --apply-chat-template)
    done
    python experiments/ruler_controls.py runs/ruler-plain/report.json runs/ruler-chat/report.json

Writes ``docs/results/ruler/controls.json`` (both reports' records, each with its count and Wilson interval and
whether the chat template was applied; the reports' metadata) and ``controls.md`` (the table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hf_rope_ext.eval import ruler, ruler_report

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "ruler"


def labelled(report: dict) -> list[dict]:
    """The report's records, counted (``ruler.counted``) and named by how the prompts were read."""
    found = []
    for r in report["records"]:
        name = "as saved, chat template" if r.get("chat_template") else "as saved, plain text"
        found.append(r | ruler.counted(r["ruler_score"], r["answers"]) | {"rope_type": name})
    return found


def main(paths: list[str]) -> int:
    reports = [json.loads(Path(p).read_text()) for p in paths]
    records = [r for report in reports for r in labelled(report)]
    metadata = [report["metadata"] for report in reports]
    (OUT / "controls.json").write_text(json.dumps({"metadata": metadata, "records": records}, indent=1) + "\n")
    (OUT / "controls.md").write_text(ruler_report.tables(records))
    print(ruler_report.tables(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
