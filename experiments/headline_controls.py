"""The controls of the 4x headline: the held-out test prompts told again in 8192 (1x) and 4096 tokens, by the model as
saved, by the chosen configurations and through the model's chat template, each key paired with its 4x answer.

    python experiments/headline.py                    # read the logs into results.json, write controls.md
    python experiments/headline_controls.py           # print the tables of the committed records

A control prompt (``--seeds-of-length 32768``) has the 4x prompt's keys, objects, wordings and depth fractions with
less filler, so each key is asked at 1x and at 4x. Every count is scored by one rule (``probes.is_hit``: the answer
starts, after spaces, with exactly the key); "named" counts an answer holding the key anywhere (``probes.names_key``)
and is shown beside it. Classic counts carry Wilson 95% intervals; multikey counts (three keys a prompt) Wilson with n =
the number of prompts (``eval.paired.by_prompt``; its coverage: ``interval_coverage.py``). Paired differences are exact
tests over the prompts both runs asked, each prompt's keys kept together (``eval.paired.sign_flip``; with one key a
prompt, McNemar's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hf_rope_ext.eval import paired, probes, splits
from hf_rope_ext.eval.intervals import score, shown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "real-model"
SAMPLES = {"classic": 30, "multikey": 24}  # multikey: 8 prompts first, 16 added (ids 8 to 23)
LONG = 32768
SE = "--rope-type self_extend --rope-param window=2048 --rope-param group_size=9"
ADAPTER = "--adapter examples/smollm2-self-extend-retrieval-lora"
EVAL = "hf-rope-ext eval --model <smollm2> {flags} --probes {probe} --split test --samples {n} --lengths {length} "
EVAL += "--dtype float32 --log docs/results/real-model/{log}"
# the 4x logs were written before lines carried their provenance
UNRECORDED = "not recorded (a)"
UNRECORDED_NOTE = "(a) Logged before log lines named their commit; from git: {}.\n"
# what "+dirty" meant for the lines that carry it: the checkout's one change, read from `git status` where they ran
DIRTY_NOTE = (
    "(b) A commit marked +dirty: the lines' checkout (f593fff) differed from its commit in one file, another "
    "cell's probe log (control-probes-saved-8192.jsonl, three lines appended by the run before); the code was the "
    "commit's.\n"
)


@dataclass(frozen=True)
class Cell:
    configuration: str  # "as saved", "self_extend", "self_extend + LoRA"
    length: int
    log: str  # under docs/results/real-model/
    flags: str = ""
    chat: bool = False
    multikey: int = SAMPLES["multikey"]  # multikey prompts planned (the chat and 4096 cells: the first 8)

    def samples(self, probe: str) -> int:
        return self.multikey if probe == "multikey" else SAMPLES[probe]

    @property
    def seeds_of(self) -> int | None:
        return None if self.length == LONG else LONG

    def command(self, probe: str) -> str:
        flags = self.flags + (f" --seeds-of-length {LONG}" if self.seeds_of else "")
        flags += " --chat-template" if self.chat else ""
        return EVAL.format(flags=flags.strip(), probe=probe, n=self.samples(probe), length=self.length, log=self.log)


CELLS = {
    "as-saved-4096": Cell("as saved", 4096, "control-probes-saved-4096.jsonl", multikey=8),
    "as-saved-8192": Cell("as saved", 8192, "control-probes-saved-8192.jsonl"),
    "se-8192": Cell("self_extend", 8192, "control-probes-se-8192.jsonl", SE),
    "se-32768": Cell("self_extend", LONG, "test-probes-se.jsonl", SE),
    "se-lora-8192": Cell("self_extend + LoRA", 8192, "control-probes-se-lora-8192.jsonl", ADAPTER),
    "se-lora-32768": Cell("self_extend + LoRA", LONG, "test-probes-se-lora.jsonl", ADAPTER),
    "as-saved-8192-chat": Cell("as saved", 8192, "control-probes-saved-8192-chat.jsonl", chat=True, multikey=8),
    "se-8192-chat": Cell("self_extend", 8192, "control-probes-se-8192-chat.jsonl", SE, chat=True, multikey=8),
    "se-lora-8192-chat": Cell(
        "self_extend + LoRA", 8192, "control-probes-se-lora-8192-chat.jsonl", ADAPTER, chat=True, multikey=8
    ),
}
HEADLINE = {"self_extend": ("se-32768", "se-8192"), "self_extend + LoRA": ("se-lora-32768", "se-lora-8192")}
WORDINGS = [question.partition("{name}")[0] for _, question in splits.TEST_WORDINGS]  # each question's opening


def logged(path: Path, chosen: list) -> list[tuple[int, object, dict]]:
    """(index, prompt, log line) of the ``chosen`` prompts that ``path`` logged for their very tokens (same hash)."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    by_id = {line["prompt_id"]: line for line in lines}
    found = [(p, prompt, by_id.get(prompt.prompt_id)) for p, prompt in enumerate(chosen)]
    return [(p, prompt, line) for p, prompt, line in found if line and line["prompt_sha"] == probes.prompt_sha(prompt)]


def keyed(prompt: int, needle: int, key: int, wording: int, answer: str, provenance: dict | None = None) -> dict:
    """One asked key, scored by the rules of this version."""
    hit, named = probes.is_hit(key, answer), probes.names_key(key, answer)
    return {"prompt": prompt, "needle": needle, "key": key, "wording": wording, "answer": answer, "hit": hit,
            "named": named, "provenance": provenance}  # fmt: skip


def read_log(tokenizer, cell: Cell, probe: str) -> list[dict]:
    """The logged keys of the test prompts of ``cell`` and ``probe`` (``logged``), in prompt order (``keyed``)."""
    chosen = splits.prompts(tokenizer, "test", probe, cell.length, cell.samples(probe), cell.seeds_of, cell.chat)
    keys = []
    for p, prompt, line in logged(RESULTS / cell.log, chosen):
        for i, (needle, (_, key, answer, _)) in enumerate(zip(prompt.needles, line["probes"], strict=True)):
            wording = next(w for w, opening in enumerate(WORDINGS) if needle.question.startswith(opening))
            keys.append(keyed(p, i, key, wording, answer, line.get("provenance")))
    return keys


def scored(keys: list[dict], probe: str, rule: str = "hit", planned: int | None = None) -> dict:
    """hits/n of ``keys`` by ``rule`` ("hit" or "named") with the interval that fits the probe's sampling."""
    record = score(sum(k[rule] for k in keys), len(keys)) if keys else {"n": 0, "hits": 0, "interval": None}
    if probe == "multikey" and keys:
        prompts = sorted({k["prompt"] for k in keys})
        per_prompt = [(sum(k[rule] for k in keys if k["prompt"] == p), sum(k["prompt"] == p for k in keys))
                      for p in prompts]  # fmt: skip
        record |= by_prompt(per_prompt)
    return record | {"prompts": len({k["prompt"] for k in keys}), "planned": planned or SAMPLES[probe]}


def by_prompt(per_prompt: list[tuple[int, int]]) -> dict:
    """The interval of a count over prompts of several keys, from (hits, keys) per prompt: Wilson by prompt."""
    return {"interval": paired.by_prompt(per_prompt), "interval_kind": "Wilson by prompt"}


def by_prompt_mark(record: dict) -> str:
    """The mark "(by prompt)" after a count whose interval is by prompt, else nothing."""
    return " (by prompt)" if record.get("interval_kind") == "Wilson by prompt" else ""


def matched(first: list[dict], second: list[dict]) -> list[tuple[dict, dict]]:
    """The keys both runs asked, matched by prompt and needle, in ``first``'s order (the keys must agree)."""
    at = {(k["prompt"], k["needle"]): k for k in second}
    both = [(k, at[k["prompt"], k["needle"]]) for k in first if (k["prompt"], k["needle"]) in at]
    if any(a["key"] != b["key"] for a, b in both):
        raise ValueError("paired runs asked different keys: the control prompts are not the 4x prompts' seeds")
    return both


def grouped(both: list[tuple[dict, dict]]) -> list[list[tuple[dict, dict]]]:
    """Matched keys grouped by prompt, prompts in order of first appearance."""
    prompts = list(dict.fromkeys(a["prompt"] for a, _ in both))
    return [[(a, b) for a, b in both if a["prompt"] == p] for p in prompts]


def pair(first: list[dict], second: list[dict]) -> dict:
    """The exact paired test over the prompts both runs asked, a prompt's keys kept together (``paired.sign_flip``),
    with the keys asked, the prompts, and the keys both found."""
    groups = grouped(matched(first, second))
    result = paired.sign_flip([[a["hit"] for a, _ in g] for g in groups], [[b["hit"] for _, b in g] for g in groups])
    both = sum(a["hit"] and b["hit"] for g in groups for a, b in g)
    return result | {"keys": sum(map(len, groups)), "prompts": len(groups), "both": both}


def kept_and_gained(saved: list[dict], other: list[dict], probe: str) -> dict[str, dict | None]:
    """ "kept": of the keys the model as saved finds (``saved``, at 1x), those ``other`` finds too; "gained": of the
    keys it misses, those ``other`` finds; each a scored record (by prompt for multikey), None where there are none."""
    out = {}
    for name, base in (("kept", True), ("gained", False)):
        groups = [[b["hit"] for a, b in g if a["hit"] == base] for g in grouped(matched(saved, other))]
        groups = [g for g in groups if g]
        record = score(sum(map(sum, groups)), sum(map(len, groups))) if groups else None
        if record is not None and probe == "multikey":
            record |= by_prompt([(sum(g), len(g)) for g in groups]) | {"prompts": len(groups)}
        out[name] = record
    return out


def commits(provenances: list[dict | None]) -> str:
    """Where logged lines ran: their commits (marked "+dirty" where the tree was not clean), UNRECORDED for lines
    without provenance."""
    found = {p["commit"][:7] + ("" if p["clean"] is True else "+dirty") for p in provenances if p}
    missing = any(p is None for p in provenances)
    return "; ".join([*sorted(found), *([UNRECORDED] if missing else [])]) or "-"


def cell_shown(record: dict) -> str:
    """``hits/n [lo, hi]``, with "(k of n prompts so far)" while a run is under way; "-" before it starts."""
    if not record["n"]:
        return "-"
    so_far = "" if record["prompts"] >= record["planned"] else f" ({record['prompts']} of {record['planned']} so far)"
    return shown(record) + by_prompt_mark(record) + so_far


RECORDED_AS = {"se-32768": "test:se", "se-lora-32768": "test:se-lora"}  # the held-out 4x records keep their names


def record_key(name: str, probe: str) -> str:
    """results.json's key of a cell's record: ``test:<cell>:<probe>`` at 4x, ``control:<cell>:<probe>`` else."""
    return f"{RECORDED_AS.get(name, 'control:' + name)}:{probe}"


def records(tokenizer) -> dict[str, list[dict]]:
    """results.json's records of every cell and probe: both scores, every key asked ([prompt, needle, key, wording,
    answer]: what the tables are made from), where the lines ran and the command."""
    out = {}
    for name, cell in CELLS.items():
        for probe in SAMPLES:
            found = read_log(tokenizer, cell, probe)
            asked = [[k["prompt"], k["needle"], k["key"], k["wording"], k["answer"]] for k in found]
            record = {"split": "test", "probe": probe, "length": cell.length, "seeds_of": cell.seeds_of}
            record |= {"chat": cell.chat, **scored(found, probe, planned=cell.samples(probe))}
            record |= {"named": scored(found, probe, "named", cell.samples(probe))}
            record |= {"run": commits([k["provenance"] for k in found]), "command": cell.command(probe)}
            out[record_key(name, probe)] = [record | {"per_key": asked}]
    return out


def keys_of(done: dict) -> dict[tuple[str, str], list[dict]]:
    """(cell, probe) -> its keys as results.json records them, each scored by the rules of this version."""
    out = {}
    for name in CELLS:
        for probe in SAMPLES:
            rows = done.get(record_key(name, probe), [{}])[0].get("per_key", [])
            out[name, probe] = [keyed(*row) for row in rows]
    return out


def headline_columns(keys: dict) -> dict[tuple[str, str], dict]:
    """(configuration, probe) -> the headline table's control columns: test at 4x, the configuration and the model as
    saved on the same keys at 1x, the keys kept and gained against the model as saved at 1x (``kept_and_gained``)
    and the paired test of the two (by prompt)."""
    out = {}
    for configuration, (long, short) in HEADLINE.items():
        for probe in SAMPLES:
            at_4x, at_1x, saved = (keys[name, probe] for name in (long, short, "as-saved-8192"))
            test, changes = scored(at_4x, probe), kept_and_gained(saved, at_4x, probe)
            out[configuration, probe] = {
                "test": cell_shown(test), "record": test, "1x": cell_shown(scored(at_1x, probe)),
                "saved": cell_shown(scored(saved, probe)), "paired": test_shown(pair(saved, at_4x)),
                **{name: share_shown(record) for name, record in changes.items()},
            }  # fmt: skip
    return out


def share_shown(record: dict | None) -> str:
    """``hits/n [lo, hi]`` of a kept or gained share, marked (by prompt) where its interval is."""
    return "-" if record is None else shown(record) + by_prompt_mark(record)


def test_shown(result: dict) -> str:
    """ "+a/-b of n keys, p" (keys only the second run found / only the first, exact two-sided p by prompt), with the
    prompts each run won where prompts hold several keys."""
    if not result["keys"]:
        return "-"
    prompts = (
        ""
        if result["keys"] == result["prompts"]
        else f" (prompts +{result['prompts_second']}/-{result['prompts_first']})"
    )
    return f"+{result['only_second']}/-{result['only_first']} of {result['keys']}{prompts}, p={result['p']:.2g}"


def wording_table(keys: dict) -> str:
    """Per configuration and length (rows) and question wording (columns): keys found, both probes pooled."""
    head = " | ".join(f'"{w.strip()} ..."' for w in WORDINGS)
    lines = [f"| configuration | length | prompt | {head} |", "|---|---:|---|" + "---:|" * len(WORDINGS)]
    for name, cell in CELLS.items():
        found = keys[name, "classic"] + keys[name, "multikey"]
        counts = [[k["hit"] for k in found if k["wording"] == w] for w in range(len(WORDINGS))]
        shown_counts = " | ".join(f"{sum(c)}/{len(c)}" if c else "-" for c in counts)
        lines.append(f"| {cell.configuration} | {cell.length} | {'chat' if cell.chat else 'plain'} | {shown_counts} |")
    return "\n".join(lines)


PAIRS = [  # (first, second): McNemar of second against first
    ("as-saved-8192", "se-32768"), ("as-saved-8192", "se-lora-32768"), ("se-8192", "se-32768"),
    ("se-lora-8192", "se-lora-32768"), ("se-32768", "se-lora-32768"), ("se-8192", "se-lora-8192"),
    ("as-saved-4096", "as-saved-8192"), ("as-saved-8192", "se-8192"), ("as-saved-8192", "as-saved-8192-chat"),
    ("se-8192", "se-8192-chat"), ("se-lora-8192", "se-lora-8192-chat"),
]  # fmt: skip


def name_of(name: str) -> str:
    cell = CELLS[name]
    return f"{cell.configuration} at {cell.length}" + (", chat" if cell.chat else "")


def pairs_table(keys: dict) -> str:
    """Exact paired tests by prompt, per probe and both pooled (a classic prompt is a prompt of one key)."""
    lines = ["| first | second | classic | multikey | both |", "|---|---|---|---|---|"]
    for first, second in PAIRS:
        tests = [pair(keys[first, p], keys[second, p]) for p in SAMPLES]
        pooled = pair(keys[first, "classic"] + shifted(keys[first, "multikey"]),
                      keys[second, "classic"] + shifted(keys[second, "multikey"]))  # fmt: skip
        cells = " | ".join(test_shown(t) for t in [*tests, pooled])
        lines.append(f"| {name_of(first)} | {name_of(second)} | {cells} |")
    return "\n".join(lines)


def shifted(keys: list[dict]) -> list[dict]:
    """Multikey keys renumbered past the classic prompts, so that pooled pairs never collide."""
    return [k | {"prompt": k["prompt"] + SAMPLES["classic"]} for k in keys]


def overview_table(done: dict, keys: dict) -> str:
    """Every cell and probe: keys found by ``is_hit`` and named anywhere, and the commits its lines ran at."""
    lines = ["| configuration | length | prompt | probe | found (is_hit) | named anywhere | run at |"]
    lines.append("|---|---:|---|---|---|---|---|")
    for (name, probe), found in keys.items():
        cell = CELLS[name]
        planned = cell.samples(probe)
        hit, named = (
            cell_shown(scored(found, probe, planned=planned)),
            cell_shown(scored(found, probe, "named", planned)),
        )
        chat = "chat" if cell.chat else "plain"
        run = done.get(record_key(name, probe), [{}])[0].get("run", "-")
        lines.append(f"| {cell.configuration} | {cell.length} | {chat} | {probe} | {hit} | {named} | {run} |")
    return "\n".join(lines)


PAGE = RESULTS / "controls.md"
INTRO = """# The 4x headline's controls

SmolLM2-135M-Instruct (trained at 8192 tokens; the Q4_1 GGUF dequantized) in float32, on the held-out test split.
The 4x cells are the headline's (32768-token prompts); every other cell asks the same keys in prompts drawn from the
4x prompts' seeds with less filler (`--seeds-of-length 32768`): same keys, objects, question wordings and depth
fractions. "chat": each prompt as the user turn of the model's own chat template, the answer stem opening the
assistant turn (`--chat-template`); the others are plain text, as the headline. Scored by `is_hit` (the answer
starts, after spaces, with exactly the key); "named anywhere" counts an answer holding the key as any of its numbers.
Classic: Wilson 95% intervals; multikey (three keys a prompt): Wilson with n = the number of prompts, whose coverage
[coverage.md](coverage.md) simulates. Made by `python experiments/headline.py` from
[results.json](results.json); each record holds its command and every key's answer.
"""


FRAME = (
    'The adapter\'s training questions ("Which {kind} belongs to the {thing}? It is") share their frame with the '
    "second wording.\n"
)
PAIRS_NOTE = (
    "+a/-b: keys only the second run found / only the first, of the keys both asked; (prompts +x/-y): prompts where "
    "the second run found more keys / fewer; p: two-sided, exact over the prompts (a prompt's keys swap together; "
    "for classic, McNemar's).\n"
)


def page(done: dict, history: dict) -> str:
    """The controls page of the records and of ``history`` (HISTORY: when the 4x lines reached the repository, and
    the replay of some of them at a later commit, a markdown section)."""
    keys = keys_of(done)
    overview = overview_table(done, keys)
    parts = [INTRO, "## Every cell\n", overview, "", UNRECORDED_NOTE.format(history["4x lines"])]
    parts += [DIRTY_NOTE] if "+dirty" in overview else []
    parts += ["## Per question wording (both probes)\n"]
    parts += [FRAME, wording_table(keys), "\n## Paired keys (exact tests by prompt)\n", PAIRS_NOTE, pairs_table(keys)]
    parts += ["\n## The 4x lines replayed\n", REPLAY_NOTE, history["replay"]]
    return "\n".join(parts)


HISTORY = RESULTS / "history.json"  # written by headline.py from git and the replay logs
REPLAY_NOTE = (
    "Some logged 4x prompts asked again at a later commit (`experiments/headline_replay.py`: 3 classic prompts and 3 "
    "multikey ones, 2 of them logged before the compiled-decode merge cd02b51), each prompt's answers compared with "
    "the logged ones as whole strings.\n"
)


def main() -> None:
    """Print the page of the committed records (``experiments/headline.py`` reads the logs and writes it)."""
    print(page(json.loads((RESULTS / "results.json").read_text()), json.loads(HISTORY.read_text())))


if __name__ == "__main__":
    main()
