"""The 4x headline's old lines, replayed: some of the logged 32768-token test prompts asked again at this commit, each
answer compared with the logged one as a whole string.

    python experiments/headline_replay.py --run       # ask the replayed prompts (resumable), then compare
    python experiments/headline_replay.py             # compare what is logged; print the page section

The 4x logs' first lines (``test-probes-se.jsonl``, ``test-probes-se-lora.jsonl``) were written before log lines
named their commit. When each line first reached the repository is read from git (``first_commits``); the engine
changed while they ran (the compiled-decode merge ``cd02b51`` among others). Replayed, from those old lines alone (the
lines appended later name their commit): 3 classic prompts drawn from every old classic line, and 3 multikey prompts,
2 drawn from the lines logged before ``cd02b51`` and 1 from those after (a fixed seed), for both configurations, logged
with their provenance in ``replay-probes-<cell>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline_controls as controls  # noqa: E402
from log_history import first_commits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = controls.RESULTS
SEED = 20261207
CELLS = {"se": ("test-probes-se.jsonl", controls.SE), "se-lora": ("test-probes-se-lora.jsonl", controls.ADAPTER)}


def chosen_ids() -> list[str]:
    """The replayed prompt ids (old lines of both 4x logs): 3 classic, 3 multikey (2 before MERGE, 1 after). Lines that
    name their own commit are not drawn from: they need no replay, and the draw stays as made when they are appended."""
    firsts = [first_commits(log) for log, _ in CELLS.values()]
    old = [{i for i, first in f.items() if not first["recorded"]} for f in firsts]
    both = sorted(old[0] & old[1])
    rng = random.Random(SEED)
    classic = [i for i in both if "/k1/" in i]
    before = [i for i in both if "/k3/" in i and not firsts[0][i]["after_merge"]]
    after = [i for i in both if "/k3/" in i and firsts[0][i]["after_merge"]]
    return rng.sample(classic, 3) + rng.sample(before, 2) + rng.sample(after, 1)


def run(ids: list[str]) -> None:
    """Ask the replayed prompts of both configurations at this commit, appended to ``replay-probes-<cell>.jsonl``."""
    import torch

    from hf_rope_ext.eval import adapters, loading, metadata, probes, splits
    from hf_rope_ext.store import smollm2

    path = smollm2.ensure()
    tokenizer = loading.load_tokenizer(path)
    for cell, (_, flags) in CELLS.items():
        adapter = ROOT / flags.split()[-1] if flags.startswith("--adapter") else None
        config = loading.load_config(adapters.config_folder(path, adapter))
        extra = loading.parse_rope_params([f.split()[-1] for f in flags.split("--rope-param")[1:]])
        requested = None if adapter else loading.requested_parameters(config, "self_extend", None, extra)
        model = loading.load_model(path, requested, dtype=torch.float32, adapter=adapter)
        model = model.merge_and_unload() if adapter is not None else model
        written = [RESULTS / f"replay-probes-{name}.jsonl" for name in CELLS]
        meta = metadata.run_metadata(
            path, "experiments/headline_replay.py --run", adapter, dtype="float32", exclude=written
        )
        params = dict(model.config.get_text_config(decoder=True).rope_parameters or {})
        ident = {k: meta[k] for k in ("model_sha256", "adapter_sha256")} | {"rope_parameters": params}
        log = probes.ProbeLog(written[list(CELLS).index(cell)], ident | {"dtype": "float32"}, meta["provenance"])
        for kind, k in (("classic", "/k1/"), ("multikey", "/k3/")):
            wanted = [i for i in ids if k in i]
            every = splits.prompts(
                tokenizer, "test", kind, controls.LONG, 1 + max(int(i.split("/")[-1]) for i in wanted)
            )
            probes.ask(model, tokenizer, [p for p in every if p.prompt_id in wanted], log)


def compare(ids: list[str]) -> list[dict]:
    """Per cell and replayed prompt: whether every answer equals the logged one (None while not replayed)."""
    rows = []
    for cell, (log, _) in CELLS.items():
        old = {x["prompt_id"]: x for x in map(json.loads, (RESULTS / log).read_text().splitlines())}
        replay = RESULTS / f"replay-probes-{cell}.jsonl"
        new = {x["prompt_id"]: x for x in map(json.loads, replay.read_text().splitlines())} if replay.is_file() else {}
        for i in ids:
            same = None
            if i in new:
                same = new[i]["prompt_sha"] == old[i]["prompt_sha"] and [p[2] for p in new[i]["probes"]] == [
                    p[2] for p in old[i]["probes"]
                ]
            run_at = controls.commits([new[i].get("provenance")]) if i in new else "-"
            rows.append({"cell": cell, "prompt_id": i, "equal": same, "run": run_at})
    return rows


def section(rows: list[dict]) -> str:
    """The page's section: the table of replayed prompts and what it says."""
    lines = ["| configuration | prompt | every answer equal to the logged one | replayed at |", "|---|---|---|---|"]
    for r in rows:
        equal = "-" if r["equal"] is None else "yes" if r["equal"] else "no"
        lines.append(f"| {controls.name_of(r['cell'] + '-32768')} | {r['prompt_id']} | {equal} | {r['run']} |")
    done = [r["equal"] for r in rows if r["equal"] is not None]
    verdict = (
        "Not replayed yet."
        if not done
        else f"{len(done) - sum(done)} of {len(done)} replayed prompts answer otherwise: the cells are to be re-run."
        if not all(done)
        else "Every replayed answer equals the logged one: the logged lines stand."
        if len(done) == len(rows)
        else f"{len(done)} of {len(rows)} replayed prompts answer as logged so far."
    )
    return "\n".join(lines) + "\n\n" + verdict + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="ask the replayed prompts first (resumable)")
    args = parser.parse_args(argv)
    ids = chosen_ids()
    if args.run:
        run(ids)
    print(section(compare(ids)))


if __name__ == "__main__":
    main()
