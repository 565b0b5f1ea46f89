"""experiments/lora_at_4x.py: every (type, schedule) run fine-tunes into its own folder and the report holds each run's
before and after measures, read from the runs' own results."""

import json
from pathlib import Path

import pytest
from conftest import load_script, save_byte_llama

L0 = 32


@pytest.fixture(scope="module")
def script():
    return load_script("lora_at_4x")


def test_runs_every_pair_and_reports_before_and_after(script, tmp_path, capsys):
    base = save_byte_llama(tmp_path / "base", L0)
    data = tmp_path / "data.txt"
    data.write_text(Path(json.__file__).read_text()[:6000])
    out = tmp_path / "story"
    argv = [
        "--model",
        str(base),
        "--out",
        str(out),
        "--factor",
        "2",
        "--types",
        "linear,yarn",
        "--schedules",
        "pose,contiguous",
        "--steps",
        "2",
        "--passkey-depths",
        "0",
        "--eval-rows",
        "1",
        "--data",
        str(data),
        "--eval-data",
        str(data),
    ]
    assert script.main(argv) == 0
    records = json.loads((out / "results.json").read_text())
    runs = {(r["rope_type"], r["schedule"], r["when"]) for r in records}
    assert runs == {(t, s, w) for t in ("linear", "yarn") for s in ("pose", "contiguous") for w in ("before", "after")}
    for t, s in [("linear", "pose"), ("yarn", "contiguous")]:  # each run's own results, in its own folder
        own = json.loads((out / f"{t}-{s}" / "eval_results.json").read_text())
        mine = [
            {k: v for k, v in r.items() if k != "schedule"}
            for r in records
            if (r["rope_type"], r["schedule"]) == (t, s)
        ]
        assert [r["far_context_ratio"] for r in own] == [r["far_context_ratio"] for r in mine]
        assert all(r["length"] == 2 * L0 for r in own)
    report = (out / "report.md").read_text()
    assert report.count("| linear | pose | 64 |") == 2 and "far_context_ratio" in report
    assert (out / "lora.png").stat().st_size > 0 and "report: " in capsys.readouterr().out


def test_an_existing_folder_is_refused(script, tmp_path):
    (tmp_path / "story").mkdir()
    with pytest.raises(SystemExit, match="exists"):
        script.main(["--out", str(tmp_path / "story")])
