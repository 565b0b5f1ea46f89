"""Every Python snippet of README.md, docs/**/*.md and the model card templates runs, as a reader would run it; so does
every code block of every example's card (``examples/*/README.md``), in the card's order.

Each snippet runs in a process of its own (``snippet_runner.py`` forks one per snippet from a parent that has
imported torch and transformers but not hf_rope_ext), in a fresh folder holding tiny local models under the
placeholder paths the docs use (``path/to/llama``, ``path/to/roformer``, ``runs/x``...). Training sizes are scaled
down (``max_steps=N`` -> 1, ``length=N`` -> 1024) so that a fine-tuning snippet takes seconds. A block of README or
docs right after a line ``<!-- not run: REASON -->`` is not run (a snippet that needs the Hub or a GPU, say); the
reason must be given.

An example's card is one job: its ```` ```python ```` blocks (each in a fresh namespace) and ```` ```bash ```` blocks
(``bash -e``, with this Python's ``bin/`` first on PATH; a fence that reads ```` ```bash no-run ```` is left out) run in
order in a folder holding a copy of the example under
its own path (``examples/<name>``), so that a command block's output is there for the blocks after it. A card that
needs SmolLM2 (it names ``smollm2``) is skipped, with the reason, where SmolLM2 cannot be fetched (as in
``test_real_model.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import torch

import hf_rope_ext
from hf_rope_ext.publish import cards
from hf_rope_ext.publish.cards import write_model_card
from hf_rope_ext.store.bundled import default_model_path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: ([^\n]*?) -->\s*\Z")  # right before a fence: the block is not run
BLOCK = re.compile(r"^```(python|bash)([^\n]*)\n(.*?)^```", re.S | re.M)
EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/README.md"))
SCALE_DOWN = [(re.compile(r"\bmax_steps=\d+"), "max_steps=1"), (re.compile(r"\blength=\d+"), "length=1024")]
NTK = {"rope_type": "ntk", "factor": 4.0, "rope_theta": 10000.0}
CARDS = ["extended", "adapter (extended config beside it)", "adapter (rope_parameters)", "export"]


def doc_snippets() -> dict[str, tuple[str | None, str]]:
    """'README.md:91' -> (the reason it is not run, or None; code) for every ```python block of the docs."""
    found = {}
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            marker = NOT_RUN.search(text[max(0, match.start() - 300) : match.start()])
            found[f"{path.relative_to(ROOT)}:{line}"] = (marker.group(1).strip() if marker else None, match.group(2))
    return found


SNIPPETS = doc_snippets()
RUN = sorted(name for name, (reason, _) in SNIPPETS.items() if reason is None)


def tiny_llama(folder: Path, rope_parameters=None) -> None:
    """A one-layer Llama with the bundled tokenizer (vocabulary 384, L0 512), saved with that tokenizer."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(0)
    config = conftest.tiny_config("llama", rope_parameters, **{**conftest.SMALL, "vocab_size": 384})
    config.max_position_embeddings = 512
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)


def tiny_roformer(folder: Path) -> None:
    from transformers import RoFormerConfig, RoFormerForMaskedLM

    torch.manual_seed(0)
    config = RoFormerConfig(
        vocab_size=384, hidden_size=32, embedding_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )  # fmt: skip
    RoFormerForMaskedLM(config).save_pretrained(folder)


def adapter(folder: Path, base: Path, with_config: bool) -> None:
    """A LoRA adapter on ``base`` with ntk rope parameters; with the extended config.json beside it, as finetune."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, rope_parameters=NTK)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(folder)
    (folder / "README.md").unlink()  # peft's placeholder card
    if with_config:
        model.config.save_pretrained(folder)


def build_models(root: Path) -> None:
    """The placeholder paths of the docs, as tiny local models under ``root``."""
    tiny_llama(root / "path/to/llama")
    for name in ("model", "base", "meta-order-weights"):
        shutil.copytree(root / "path/to/llama", root / "path/to" / name)
    shutil.copytree(root / "path/to/llama", root / "path/to/interleaved")
    config = json.loads((root / "path/to/interleaved/config.json").read_text())
    (root / "path/to/interleaved/config.json").write_text(json.dumps({**config, "rope_layout": "interleaved"}))
    tiny_roformer(root / "path/to/roformer")
    (root / "my_texts").mkdir()
    for module in (json, re, shutil):  # a few thousand tokens of text to fine-tune on
        (root / "my_texts" / f"{module.__name__}.txt").write_text(Path(module.__file__).read_text())
    tiny_llama(root / "out/llama-ntk4", NTK)
    (root / "out/llama-ntk4/ppl.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # a file inside the folder for `plot=`
    adapter(root / "runs/x", root / "path/to/base", with_config=True)
    config = json.loads((root / "runs/x/adapter_config.json").read_text())  # the base, relative to the snippet's cwd
    (root / "runs/x/adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "path/to/base"}))


def card_snippets(root: Path) -> dict[str, str]:
    """The usage snippet of a card rendered from each template in hf_rope_ext/publish/model_cards/."""
    folders = {"extended": root / "out/llama-ntk4"}
    folders["adapter (extended config beside it)"] = root / "runs/x"
    adapter(root / "runs/bare", root / "path/to/base", with_config=False)
    folders["adapter (rope_parameters)"] = root / "runs/bare"
    hf_rope_ext.export(root / "out/llama-ntk4", root / "out/portable")
    folders["export"] = root / "out/portable"
    kinds = {"extended": "extended", "export": "export"}
    found = {}
    for name, folder in folders.items():
        if name != "export":
            write_model_card(folder, kind=kinds.get(name, "adapter"), base_model=str(root / "path/to/base"))
        (code,) = re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(), flags=re.S)
        found[name] = code
    return found


def example_program(name: str) -> str:
    """The runnable blocks of ``examples/<name>/README.md`` as one program, in the card's order (no-run left out)."""
    path = ROOT / "examples" / name / "README.md"
    text = path.read_text(encoding="utf-8")
    lines = ["import subprocess"]
    for match in BLOCK.finditer(text):
        language, info, code = match.groups()
        if "no-run" in info.split():
            continue
        where = f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
        lines.append(f"print({'--- ' + where!r}, flush=True)")
        if language == "python":
            lines.append(f"exec(compile({code!r}, {where!r}, 'exec'), {{'__name__': '__main__'}})")
        else:
            lines.append(f"subprocess.run(['bash', '-ec', {code!r}], check=True)")
    return "\n".join(lines)


def example_jobs(tmp: Path) -> tuple[list[dict], dict[str, str]]:
    """One job per example card, in a folder holding a copy of the example; (jobs, name -> reason not run)."""
    jobs, skipped = [], {}
    for name in EXAMPLES:
        if "smollm2" in (ROOT / "examples" / name / "README.md").read_text(encoding="utf-8"):
            reason = smollm2_unavailable()
            if reason:
                skipped[f"examples: {name}"] = reason
                continue
        cwd = tmp / f"example-{name}"
        shutil.copytree(ROOT / "examples" / name, cwd / "examples" / name)
        log = str(tmp / f"example-{name}.log")
        jobs.append({"name": f"examples: {name}", "code": example_program(name), "cwd": str(cwd), "log": log})
    return jobs, skipped


def smollm2_unavailable() -> str:
    """Why SmolLM2 cannot be had ('' when it can: fetched and converted once, then read from the cache)."""
    from hf_rope_ext.store import smollm2

    try:
        smollm2.ensure()
    except OSError as err:
        return f"SmolLM2 could not be fetched or converted: {err}"
    return ""


def prepare(code: str) -> str:
    for pattern, small in SCALE_DOWN:
        code = pattern.sub(small, code)
    return code


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every snippet once; name -> (exit status, log text)."""
    tmp = tmp_path_factory.mktemp("snippets")
    template = tmp / "template"
    build_models(template)
    codes = {name: SNIPPETS[name][1] for name in RUN}
    codes |= {f"model_cards: {name}": code for name, code in card_snippets(template).items()}
    jobs = []
    for i, (name, code) in enumerate(codes.items()):
        cwd = tmp / f"run{i}"
        shutil.copytree(template, cwd, symlinks=True, ignore=_runs_made_by(code))
        jobs.append({"name": name, "code": prepare(code), "cwd": str(cwd), "log": str(tmp / f"run{i}.log")})
    examples, skipped = example_jobs(tmp)
    jobs += examples
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # hf-rope-ext in bash
    runner = [sys.executable, str(Path(__file__).with_name("snippet_runner.py")), "jobs.json", "results.json"]
    subprocess.run(runner, cwd=tmp, env=env, check=True, timeout=900)
    status = json.loads((tmp / "results.json").read_text())
    ran = {job["name"]: (status[job["name"]][0], Path(job["log"]).read_text()) for job in jobs}
    return ran | {name: (None, reason) for name, reason in skipped.items()}


def _runs_made_by(code: str):
    """A snippet that fine-tunes into runs/ makes that folder itself: do not provide it."""
    makes = "finetune(" in code

    def ignore(directory, entries):
        return ["runs"] if makes and Path(directory).name.startswith("template") else []

    return ignore


@pytest.mark.parametrize("name", RUN)
def test_doc_snippet_runs(results, name):
    status, log = results[name]
    assert status == 0, f"{name} failed (exit {status}):\n{log[-4000:]}"


@pytest.mark.parametrize("name", CARDS)
def test_card_snippet_runs(results, name):
    status, log = results[f"model_cards: {name}"]
    assert status == 0, f"{name} card snippet failed (exit {status}):\n{log[-4000:]}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_card_runs(results, name):
    status, log = results[f"examples: {name}"]
    if status is None:
        pytest.skip(log)
    assert status == 0, f"examples/{name}/README.md failed (exit {status}):\n{log[-4000:]}"


def test_every_template_and_doc_block_is_covered():
    templates = {p.stem for p in cards.templates_dir().glob("*.md")}
    assert templates == {name.split(" ")[0] for name in CARDS}
    assert len(RUN) >= 8 and all(SNIPPETS[n][0] for n in set(SNIPPETS) - set(RUN))  # a block not run says why
    assert any(name.startswith("docs/") for name in RUN)


def test_a_block_after_a_not_run_comment_is_left_out():
    text = "<!-- not run: needs the Hub -->\n```python\nimport x\n```\n\n```python\nimport y\n```\n"
    reasons = [NOT_RUN.search(text[max(0, m.start() - 300) : m.start()]) for m in FENCE.finditer(text)]
    assert reasons[0].group(1) == "needs the Hub" and reasons[1] is None
    assert EXAMPLES and all("exec(compile(" in example_program(name) for name in EXAMPLES)  # each runs some Python
