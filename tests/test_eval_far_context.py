"""Far-context loss, the sliding-window baseline, passkey by depth and the main job's report, against independent
computations on a tiny random Llama (L0 = 64)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import EVAL_L0 as L0
from conftest import PNG_MAGIC, save_eval_llama

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.eval import compare, load_model, load_token_documents, load_tokenizer, passkey_accuracy, plots, report
from hf_rope_ext.eval.far_context import far_context_ratio, sliding_window_baseline, sliding_window_losses
from hf_rope_ext.eval.metadata import folder_hash
from hf_rope_ext.eval.passkey import by_depth, compose, passkeys, spread_depths, tokenize_pieces
from hf_rope_ext.eval.runner import EvalPlan


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny_far"), seed=2, num_hidden_layers=2)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def documents(tiny_dir, docs_dir):
    return load_token_documents(load_tokenizer(tiny_dir), docs_dir)


@torch.no_grad()
def loop_loss(model, ids, t: int, end: int, window: int) -> float:
    """Loss of token t read inside the window ids[end - window : end] (t < end): one forward pass, plain indexing."""
    logits = model(input_ids=ids[None, end - window : end]).logits[0]
    return F.cross_entropy(logits[t - 1 - (end - window)], ids[t]).item()


@pytest.mark.parametrize("stride", [1, 5, 20])
def test_sliding_window_losses_equal_a_plain_loop_over_tokens(model, stride):
    ids = torch.randint(3, 259, (150,), generator=torch.Generator().manual_seed(0))
    window, chunk = 32, 40
    found = sliding_window_losses(model, ids, window, chunk, stride, batch=3)
    expected = []
    for t in range(150 - chunk, 150):
        end = 150 - (150 - 1 - t) // stride * stride  # the window that scores t ends here
        expected.append(loop_loss(model, ids, t, end, window))
        seen = window - (end - t)  # tokens before t inside its window
        assert window - stride <= seen <= window - 1
    assert found.tolist() == pytest.approx(expected, abs=1e-5)


def test_sliding_window_baseline_averages_the_documents_long_enough(model, documents):
    total, chunk = 260, L0 - 1
    found = sliding_window_baseline(model, documents, total, L0, chunk, stride=1)
    losses = [
        loop_loss(model, d, t, t + 1, L0) for d in documents if len(d) >= total for t in range(total - chunk, total)
    ]
    assert found == pytest.approx(sum(losses) / len(losses), abs=1e-5)


def test_sliding_window_bad_arguments_are_errors(model):
    ids = torch.arange(3, 103)
    with pytest.raises(ValueError, match="stride=40"):
        sliding_window_losses(model, ids, 32, 40, stride=40)
    with pytest.raises(ValueError, match="tokens=100"):
        sliding_window_losses(model, ids, 64, 63, stride=1)


def test_far_context_ratio_is_the_perplexity_ratio():
    assert far_context_ratio(2.0, 2.5) == pytest.approx(math.exp(2.0) / math.exp(2.5))


@pytest.fixture(scope="module")
def comparison(tiny_dir, docs_dir):
    plan = EvalPlan(lengths=(2,), documents=2, last_chunk=None, passkey_depths=0, far_context=True, far_stride=1)
    return compare.run_comparison(tiny_dir, [None, "yarn"], (2.0, 4.0), plan, docs_dir, progress=False)


def test_far_context_loss_is_the_last_l0_tokens_of_the_longest_window(comparison, tiny_dir, documents):
    total = 4 * L0
    docs = [d[:total] for d in documents if len(d) >= total][:2]
    base = load_model(tiny_dir)
    baseline = [loop_loss(base, d, t, t + 1, L0) for d in docs for t in range(total - L0 + 1, total)]
    for record in comparison:
        n = record["length"]
        params = record["rope_parameters"]
        m = load_model(tiny_dir, params)
        with torch.no_grad():
            losses = [
                F.cross_entropy(m(input_ids=d[None, total - n :]).logits[0, -L0:-1], d[-(L0 - 1) :]) for d in docs
            ]
        loss = torch.stack(losses).mean().item()
        assert record["far_context_loss"] == pytest.approx(loss, abs=1e-5)
        assert record["far_context_baseline"] == pytest.approx(sum(baseline) / len(baseline), abs=1e-5)
        assert record["far_context_ratio"] == pytest.approx(math.exp(loss - record["far_context_baseline"]), rel=1e-6)
    covered = {(r["rope_type"], r["length"]) for r in comparison}
    assert covered == {(m, n) for m in ("none", "yarn") for n in (L0, 2 * L0, 4 * L0)}


def test_passkey_by_depth_is_scored_by_hand(model, tiny_dir):
    tokenizer = load_tokenizer(tiny_dir)
    result = passkey_accuracy(model, tokenizer, 300, depths=3, trials=2, generate=False, seed=7, progress=False)
    keys = passkeys(6, 7)
    hits = {}
    for i, depth in enumerate(spread_depths(3)):
        for t in range(2):
            sample = compose(tokenize_pieces(tokenizer, keys[i * 2 + t]), 300, depth)
            with torch.no_grad():
                logits = model(input_ids=sample.input_ids[None]).logits[0]
            answer = sample.input_ids[sample.prompt_length :]
            hit = all(logits[sample.prompt_length - 1 + k].argmax() == answer[k] for k in range(len(answer)))
            hits.setdefault(depth, []).append(hit)
    expected = [[d, sum(h) / 2] for d, h in sorted(hits.items())]
    assert result["passkey_by_depth"] == expected
    assert result["passkey_accuracy"] == pytest.approx(sum(sum(h) for h in hits.values()) / 6)


class NextTokenOracle(torch.nn.Module):
    """A "model" whose logits at t put all mass on input t + 1 (so every answer token is right), except on the
    last ``wrong_last`` positions, where it names token 0: an independent check of the scoring rule."""

    def __init__(self, vocab: int, wrong_last: int = 0):
        super().__init__()
        self.vocab, self.wrong_last, self.anchor = vocab, wrong_last, torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, **kwargs):
        nxt = torch.cat((input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])), dim=1)
        if self.wrong_last:
            nxt[:, -1 - self.wrong_last : -1] = 0
        return type("Out", (), {"logits": F.one_hot(nxt, self.vocab).float()})()


@pytest.mark.parametrize("wrong_last, accuracy", [(0, 1.0), (1, 0.0)])
def test_passkey_needs_every_answer_token(tiny_dir, wrong_last, accuracy):
    """All answer tokens right: every depth scores 1; only the last one wrong: every depth scores 0."""
    tokenizer = load_tokenizer(tiny_dir)
    oracle = NextTokenOracle(len(tokenizer), wrong_last)
    result = passkey_accuracy(oracle, tokenizer, 300, depths=3, trials=2, generate=False, seed=7, progress=False)
    assert result["passkey_accuracy"] == accuracy
    assert result["passkey_by_depth"] == [[d, accuracy] for d in spread_depths(3)]


def test_by_depth_counts_hits_per_depth():
    assert by_depth([0.0, 1.0, 0.0, 1.0, 0.5], [True, True, False, True, False]) == [[0.0, 0.5], [0.5, 0.0], [1.0, 1.0]]


def test_passkey_grids_and_heatmap_png(tmp_path):
    records = [
        {"rope_type": "none", "length": 64, "passkey_by_depth": [[0.0, 1.0], [1.0, 0.5]]},
        {"rope_type": "none", "length": 128, "passkey_by_depth": [[0.0, 0.0], [1.0, 0.0]]},
        {"rope_type": "yarn", "length": 128, "passkey_by_depth": [[0.0, 1.0], [1.0, 1.0]]},
    ]
    grids = report.passkey_grids(records)
    assert grids["none"] == ([0.0, 1.0], [64, 128], [[1.0, 0.0], [0.5, 0.0]])
    assert grids["yarn"] == ([0.0, 1.0], [128], [[1.0], [1.0]])
    path = report.plot_passkey_grid(records, tmp_path / "grid.png")
    assert path.read_bytes()[:4] == PNG_MAGIC


@pytest.mark.parametrize("low, high", [(4.9, 5.2), (5.0, 5.01), (3.0, 30.0), (0.5, 900.0)])
def test_log_ticks_label_every_range(low, high):
    ticks = report.log_ticks(low, high)
    assert len(ticks) >= 3 and all(low - 1e-9 * high <= t <= high * (1 + 1e-3) for t in ticks)
    assert len(set(ticks)) == len(ticks)


def saved_figure(monkeypatch) -> dict:
    """What the next saved figure shows: per panel its title, y labels and its lines' (label, marker, dash, colour)."""
    import matplotlib.figure

    seen = {}
    original = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):  # read the figure as it is saved
        seen["title"] = fig._suptitle.get_text() if fig._suptitle else ""
        seen["panels"] = [
            {
                "title": ax.get_title(),
                "labels": [t.get_text() for t in ax.get_yticklabels()],
                "lines": [
                    (ln.get_label(), ln.get_marker(), ln.get_linestyle(), ln.get_color()) for ln in ax.get_lines()
                ],
            }
            for ax in fig.axes
        ]
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return seen


NAMES = ["none", "linear", "yarn", "ntk", "dynamic_yarn", "rerope", "self_extend"]


def test_perplexity_plot_has_a_panel_per_level_and_y_labels_on_a_narrow_range(tmp_path, monkeypatch):
    seen = saved_figure(monkeypatch)
    records = [
        {"rope_type": n, "length": x, "perplexity": 5.0 + 0.01 * i + x / 1e5}
        for i, n in enumerate(NAMES)
        for x in (64, 128)
    ]
    report.plot_perplexity(records, tmp_path / "p.png", pretraining_length=64)
    assert seen["title"] and len([t for t in seen["panels"][0]["labels"] if t]) >= 3
    methods = [[line[0] for line in p["lines"] if not line[0].startswith("_")] for p in seen["panels"]]
    assert [p["title"] for p in seen["panels"]] == list(plots.LEVELS.values())
    assert methods == [
        ["none (as saved)", "linear", "yarn", "pretraining length"],
        ["none (as saved)", "ntk", "dynamic_yarn", "pretraining length"],
        ["none (as saved)", "rerope", "self_extend", "pretraining length"],
    ]
    for panel in seen["panels"]:  # in a panel every line its own marker, dash and colour
        styles = [line[1:] for line in panel["lines"] if not line[0].startswith("_")]
        assert len(set(styles)) == len(styles)


def test_far_context_plot_draws_the_ratio_against_the_baseline_at_one(tmp_path, monkeypatch):
    seen = saved_figure(monkeypatch)
    records = [
        {"rope_type": n, "length": x, "far_context_ratio": 0.9 + 0.05 * i * x / 128}
        for i, n in enumerate(NAMES)
        for x in (64, 128)
    ]
    path = report.plot_far_context(records, tmp_path / "far.png")
    assert path.read_bytes()[:4] == PNG_MAGIC and "far-context" in seen["title"]
    for panel in seen["panels"]:
        assert ("sliding-window baseline", "None", "--", "black") in panel["lines"]


def test_extend_writes_report_with_model_documents_date_command(tmp_path, capsys):
    model_dir = save_eval_llama(tmp_path / "model", max_position_embeddings=256)  # long enough for a passkey prompt
    data_dir = tmp_path / "docs"
    data_dir.mkdir()
    (data_dir / "a.txt").write_text("".join(f"x{i % 7} = f(y{i % 5}) + {i}\n" for i in range(100)))
    out = tmp_path / "report"
    argv = ["extend", "--model", str(model_dir), "--data", str(data_dir), "--factors", "2", "--documents", "1"]
    argv += ["--rope-type", "yarn", "--report-dir", str(out), "--passkey-depths", "2", "--passkey-trials", "1"]
    assert main(argv + ["--last-chunk", "0", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    text = (out / "report.md").read_text()
    assert f"model: `{model_dir}`" in text and "documents: 1 per length" in text and str(data_dir) in text
    assert "date: 20" in text and "--passkey-depths 2 --passkey-trials 1" in text
    assert "Far-context perplexity ratio" in text and "Passkey accuracy" in text
    for name in ("report.md", "report.json", "perplexity.png", "far_context.png", "passkey.png"):
        assert str(out / name) in printed
    assert (out / "passkey.png").read_bytes()[:4] == PNG_MAGIC
    assert (out / "far_context.png").read_bytes()[:4] == PNG_MAGIC  # the far-context ratio, the figure that matters
    meta = json.loads((out / "report.json").read_text())["metadata"]
    assert meta["versions"]["hf-rope-ext"] == hf_rope_ext.__version__ and meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["transformers"] == transformers.__version__ and meta["model"] == str(model_dir)
    assert meta["command"].startswith(f"hf-rope-ext extend --model {model_dir} --rope-type yarn")
    assert meta["model_sha256"] == folder_hash(model_dir) and len(meta["model_sha256"]) == 64
    assert meta["date"][:2] == "20" and meta["date"] in text and meta["model_sha256"] in text
