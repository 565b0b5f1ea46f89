"""The static rows' tables of docs/results/compiled-decode-cpu.md, made from the records of
``bench_compiled_decode.py`` run before them and with them (the same script, the package at two commits).

    PYTHONPATH=. python benchmarks/static_rows_report.py [--write]

1. ``static-rows-module``: the attention module's compiled step at 32768 cached tokens, ms before and after, with
   quartiles; after / before; the step against transformers' plain step and against the GQA-aware plain step of the
   same run (``default_gqa``: sdpa reading each kv head once).
2. ``static-rows-generate``: SmolLM2-135M-Instruct's compiled ``generate`` after an 8192-token prompt, decode tokens/s
   before and after, the new tokens that agree with the uncompiled run's, the ratios to both plain steps, and the
   prompt's seconds before and after (where a type was run before).
3. ``near-rows``: Dual Chunk Attention's near bands reading the kept rows, against the static rows' runs.
4. ``prompt-once``: SmolLM2's ``generate`` after 8192 and 32768-token prompts, each row's prompt read once
   (``--prompt-once``): compiled and eager decode tokens/s with their ratios to plain's of the same run.
5. ``after-module``: the module's compiled step before and after a two-band window turned by the near table
   (``engine.static_rows.near_table``), one run after the other; the other types' steps, unchanged, the controls.
6. ``after``: ``prompt-once``'s runs again with the CPU decode pieces split along their keys (``engine.split_keys``,
   the eager step) and the near table (the compiled step), each step against plain's of its run; the prompt, the
   types a change does not touch (xPos, RoPER and Dual Chunk Attention compiled) and plain itself are the controls.
7. ``bands``: ``after``'s runs again with the eager step's pieces merged once (``engine.union``), Dual Chunk
   Attention's bands on their own keys (``engine.chunk_decode.host_bands``) and a static layer's rows read, not kept
   twice; the compiled step, unchanged, and the prompt are the controls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "compiled-decode-cpu.md"
RECORDS = PAGE.parent / "compiled-decode-cpu"
MODULE = ("static-rows-before-b617055.json", "static-rows-1eaa1ca.json")
GENERATE = ("smollm2-8k-static-rows-before-b617055.json", "smollm2-8k-static-rows-1eaa1ca.json")
ONCE = ("smollm2-8k-prompt-once-09f8d2f.json", "smollm2-32k-prompt-once-09f8d2f.json")  # shortest prompt first
AFTER = ("smollm2-8k-prompt-once-d00a188.json", "smollm2-32k-prompt-once-f6eaf62.json")  # keys split, near table
# the eager step's pieces merged once, Dual Chunk Attention's bands apart
BANDS = ("smollm2-8k-prompt-once-e6ed475.json", "smollm2-32k-prompt-once-93f9957.json")
AFTER_MODULE = ("module-before-09f8d2f.json", "module-f6eaf62.json")  # the module's step before and after the table
NEAR = ("dual-chunk-near-7f06f97.json", "smollm2-8k-dual-chunk-near-7f06f97.json")  # the near bands' rows kept


def records(name: str, kind: str) -> dict:
    """rope_type -> record of the ``kind`` pass in record file ``name``."""
    found = json.loads((RECORDS / name).read_text(encoding="utf-8"))["records"]
    return {r["rope_type"]: r for r in found if r["pass"] == kind}


def spread(value: float, quartiles: list[float]) -> str:
    return f"{value:.1f} ({quartiles[0]:.1f}-{quartiles[1]:.1f})"


def module_table() -> str:
    """Times (lower is better): the after / before column is before's ms over after's."""
    before, after = (records(name, "graphed") for name in MODULE)
    plain, gqa = after["default"]["ms"], after["default_gqa"]["ms"]
    lines = ["| rope_type | before, ms (quartiles) | static rows, ms (quartiles) | faster by | x plain | x GQA plain |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, now in after.items():
        old = before[name]
        cells = [spread(old["ms"], old["ms_quartiles"]), spread(now["ms"], now["ms_quartiles"])]
        ratios = [old["ms"] / now["ms"], now["ms"] / plain, now["ms"] / gqa]
        lines.append(f"| {name} | {' | '.join(cells)} | {' | '.join(f'{x:.2f}' for x in ratios)} |")
    return "\n".join(lines)


def generate_table() -> str:
    """Rates (higher is better): "x plain" is plain's tokens/s over the type's (above 1: slower than plain)."""
    before, after = (records(name, "generate") for name in GENERATE)
    plain, gqa = after["default"]["tokens_per_s"], after["default_gqa"]["tokens_per_s"]
    head = "| rope_type | new tokens as uncompiled | before, tokens/s | static rows, tokens/s | faster by | x plain "
    lines = [head + "| x GQA plain | prompt s, before / now |", "| --- |" + " ---: |" * 7]
    for name, now in after.items():
        old, rate = before.get(name), now["tokens_per_s"]
        was = spread(old["tokens_per_s"], old["tokens_per_s_quartiles"]) if old else "-"
        gain = f"{rate / old['tokens_per_s']:.2f}" if old else "-"
        prompt = f"{old['prefill_s']:.1f} / {now['prefill_s']:.1f}" if old else f"- / {now['prefill_s']:.1f}"
        agree = f"{now['tokens_agree']} of {now['new_tokens']}"
        cells = [agree, was, spread(rate, now["tokens_per_s_quartiles"]), gain, f"{plain / rate:.2f}"]
        lines.append(f"| {name} | {' | '.join(cells)} | {gqa / rate:.2f} | {prompt} |")
    return "\n".join(lines)


def near_table() -> str:
    """Dual Chunk Attention's near bands read from the kept rows: its module step and SmolLM2's decode against the
    static rows' run (its near keys then turned at every step), plain and Self-Extend of the same runs."""
    module = [records(name, "graphed") for name in (MODULE[1], NEAR[0])]
    generate = [records(name, "generate") for name in (GENERATE[1], NEAR[1])]
    head = "| rope_type | module, ms: static rows / near rows kept "
    lines = [head + "| SmolLM2, tokens/s: static rows / near rows kept |", "| --- | ---: | ---: |"]
    for name in ("default", "self_extend", "dual_chunk"):
        ms = [spread(run[name]["ms"], run[name]["ms_quartiles"]) for run in module]
        rates = [spread(run[name]["tokens_per_s"], run[name]["tokens_per_s_quartiles"]) for run in generate]
        lines.append(f"| {name} | {' / '.join(ms)} | {' / '.join(rates)} |")
    return "\n".join(lines)


RATES = (("eager_tokens_per_s", "eager_quartiles"), ("tokens_per_s", "tokens_per_s_quartiles"))  # eager, compiled


def ratio_cells(run: dict, rope_type: str, rate: str, quartiles: str) -> list[str]:
    """[the type's ``rate`` with its quartiles, plain's ``rate`` of the same run over the type's]."""
    value = run[rope_type][rate]
    return [spread(value, run[rope_type][quartiles]), f"{run['default'][rate] / value:.2f}"]


def once_table() -> str:
    """Rates (higher is better): "x plain" is plain's tokens/s over the type's, compiled against compiled (plain as
    transformers runs it, and GQA-aware) and eager against eager."""
    head = "| prompt | rope_type | new tokens as uncompiled | compiled, tokens/s | x plain | x GQA plain "
    lines = [head + "| eager, tokens/s | eager x plain eager | prompt s |", "| ---: | --- |" + " ---: |" * 7]
    for name in ONCE:
        run = records(name, "generate")
        gqa = run["default_gqa"]
        for rope_type, r in run.items():
            compiled = [*ratio_cells(run, rope_type, *RATES[1]), f"{gqa['tokens_per_s'] / r['tokens_per_s']:.2f}"]
            uncompiled = ratio_cells(run, rope_type, *RATES[0])
            cells = [str(r["tokens"]), rope_type, f"{r['tokens_agree']} of {r['new_tokens']}", *compiled, *uncompiled]
            lines.append(f"| {' | '.join(cells)} | {r['prefill_s']:.0f} |")
    return "\n".join(lines)


def after_table(befores: tuple = ONCE, nows: tuple = AFTER) -> str:
    """Rates (higher is better) of the runs ``befores`` and ``nows`` (by default ``ONCE``'s and ``AFTER``'s: the eager
    step's long pieces split along their keys, a two-band window turned by the near table when compiled), eager and
    compiled, each with plain's of its run over the type's; ``nows`` may stop at a shorter prompt."""
    head = "| prompt | rope_type | eager before | x plain | eager now | x plain | compiled before | x plain "
    lines = [head + "| compiled now | x plain | prompt s, before / now |", "| ---: | --- |" + " ---: |" * 9]
    for before_name, now_name in zip(befores[: len(nows)], nows, strict=True):
        runs = records(before_name, "generate"), records(now_name, "generate")
        for rope_type, r in runs[1].items():
            cells = [str(r["tokens"]), rope_type]
            for rate, quartiles in RATES:
                cells += [c for run in runs for c in ratio_cells(run, rope_type, rate, quartiles)]
            cells.append(" / ".join(f"{run[rope_type]['prefill_s']:.0f}" for run in runs))
            lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def after_module_table() -> str:
    """The module's compiled step (ms, lower is better) before and after the near table, one run after the other."""
    before, now = (records(name, "graphed") for name in AFTER_MODULE)
    lines = ["| rope_type | before, ms (quartiles) | now, ms (quartiles) | faster by | x plain |"]
    lines.append("| --- |" + " ---: |" * 4)
    for name, r in now.items():
        cells = [spread(before[name]["ms"], before[name]["ms_quartiles"]), spread(r["ms"], r["ms_quartiles"])]
        ratios = [before[name]["ms"] / r["ms"], r["ms"] / now["default"]["ms"]]
        lines.append(f"| {name} | {' | '.join(cells)} | {' | '.join(f'{x:.2f}' for x in ratios)} |")
    return "\n".join(lines)


def tables() -> dict[str, str]:
    made = {"static-rows-module": module_table(), "static-rows-generate": generate_table(), "near-rows": near_table()}
    made |= {"prompt-once": once_table(), "after-module": after_module_table(), "after": after_table()}
    return {**made, "bands": after_table(AFTER, BANDS)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"also write the tables into {PAGE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("glance", ROOT / "experiments" / "results_at_a_glance.py")
    glance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glance)
    for block, text in tables().items():
        print(text, end="\n\n")
        if args.write:
            glance.replace_block(PAGE, block, text)


if __name__ == "__main__":
    main()
