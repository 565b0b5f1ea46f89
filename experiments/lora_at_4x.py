"""The fine-tuning half of the story: LoRA at s x L0 (default 4x) for a few CPU minutes, with each rope type and
position schedule asked for, and the main job's measures on the same held-out text before and after training.

For every (rope type, schedule) pair it runs ``hf_rope_ext.train.finetune`` into ``OUT/<type>-<schedule>`` with
evaluation at s x L0: truncated-document perplexity, passkey accuracy over depths (teacher-forced), and the
far-context loss on the last L0 - 1 tokens against the base model reading them through a sliding L0 window
(``far_context_ratio`` < 1: the longer context helped). "before" is the rope type applied without training.
Then it writes OUT/report.md (one table), OUT/results.json (every record) and OUT/lora.png (before/after bars).

    PYTHONPATH=. python experiments/lora_at_4x.py --out runs/lora-4x
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPORT, RESULTS, PLOT = "report.md", "results.json", "lora.png"


def parse_args(argv=None) -> argparse.Namespace:
    from hf_rope_ext.cli.args import comma_list, factor, non_negative_int, positive_float, positive_int

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="base model folder (default: the bundled tiny-llama-stdlib)")
    p.add_argument("--out", type=Path, required=True, help="new folder for the runs and the report")
    p.add_argument("--factor", type=factor, default=4.0, help="s: train and evaluate at s x L0")
    p.add_argument("--types", type=comma_list(str), default=["linear", "yarn"], help="rope types to fine-tune")
    p.add_argument("--schedules", type=comma_list(str), default=["pose", "contiguous"], help="position schedules")
    p.add_argument("--steps", type=positive_int, default=60, help="optimizer steps per run")
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--rank", type=positive_int, default=8)
    p.add_argument("--passkey-depths", type=non_negative_int, default=5, help="0: no passkey")
    p.add_argument("--eval-rows", type=positive_int, default=3, help="held-out documents per measure")
    p.add_argument("--data", nargs="+", default=None, help="training text (default: the bundled train split)")
    p.add_argument("--eval-data", nargs="+", default=None, help="held-out text (default: the bundled eval split)")
    return p.parse_args(argv)


def run_config(args, rope_type: str, schedule: str, pretrain: int):
    """One fine-tuning run of the comparison, evaluated at s x L0 before and after."""
    from hf_rope_ext.store import bundled
    from hf_rope_ext.train import FinetuneConfig

    length = int(args.factor * pretrain)
    return FinetuneConfig(
        model=args.model or str(bundled.default_model_path()),
        out=str(args.out / f"{rope_type}-{schedule}"),
        rope_type=rope_type,
        factor=args.factor,
        length=length,
        max_steps=args.steps,
        position_schedule=schedule,
        data=args.data,
        eval_data=args.eval_data,
        rank=args.rank,
        lr=args.lr,
        warmup_steps=min(10, args.steps // 10),
        eval_lengths=[length],
        eval_rows=args.eval_rows,
        passkey_depths=args.passkey_depths,
        eval_far_context=True,
    )


MEASURES = ("perplexity", "passkey_accuracy", "far_context_ratio")


def table(records: list[dict]) -> str:
    """Markdown: one row per (rope type, schedule, before/after) with the three measures."""
    head = ["rope type", "schedule", "length", "when", *MEASURES]
    rows = [
        [
            r["rope_type"],
            r["schedule"],
            str(r["length"]),
            r["when"],
            *(f"{r[m]:.3f}" if m in r else "-" for m in MEASURES),
        ]
        for r in records
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def plot(records: list[dict], path: Path) -> None:
    """Two panels of grouped bars, passkey accuracy and far-context ratio, before and after each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    runs = sorted({(r["rope_type"], r["schedule"]) for r in records})
    value = {(r["rope_type"], r["schedule"], r["when"], m): r.get(m, float("nan")) for r in records for m in MEASURES}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(runs))
    for ax, measure in zip(axes, ("passkey_accuracy", "far_context_ratio"), strict=True):
        for shift, when, colour in ((-0.2, "before", "#9e9e9e"), (0.2, "after", "#1f77b4")):
            bars = ax.bar(x + shift, [value[(*run, when, measure)] for run in runs], 0.4, label=when, color=colour)
            ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_xticks(x, [f"{t}\n{s}" for t, s in runs])
        ax.set_title(measure.replace("_", " "))
        ax.legend()
    axes[1].axhline(1.0, color="black", lw=0.8, ls="--")  # the sliding-window baseline
    axes[1].set_yscale("log")  # ratios around 1 and far above it in one panel
    axes[1].yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2))  # ..., 0.5, 1, 2, 4, ...
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.suptitle(f"LoRA at {records[0]['length']} tokens: before and after")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    from hf_rope_ext.eval.loading import load_config, pretraining_length
    from hf_rope_ext.store import bundled
    from hf_rope_ext.train import finetune

    if args.out.exists():
        raise SystemExit(f"--out {str(args.out)!r} exists; choose a new folder (nothing was written)")
    pretrain = pretraining_length(load_config(args.model or bundled.default_model_path()))
    configs = [run_config(args, t, s, pretrain) for t in args.types for s in args.schedules]
    records = []
    for cfg in configs:
        print(f"fine-tuning {cfg.rope_type} ({cfg.position_schedule}) at {cfg.length} tokens -> {cfg.out}", flush=True)
        result = finetune(cfg)
        records += [{**r, "schedule": cfg.position_schedule, "rope_type": cfg.rope_type} for r in result["results"]]
    (args.out / RESULTS).write_text(json.dumps(records, indent=2) + "\n")
    command = "PYTHONPATH=. python " + " ".join(["experiments/lora_at_4x.py", *(argv or sys.argv[1:])])
    (args.out / REPORT).write_text(f"# LoRA at {args.factor:g}x: before and after\n\n`{command}`\n\n{table(records)}\n")
    plot(records, args.out / PLOT)
    print(table(records))
    print(f"report: {args.out / REPORT}\nplot: {args.out / PLOT}\nrecords: {args.out / RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
