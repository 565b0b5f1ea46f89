"""benchmarks/bench_attention.py runs end to end on small sizes: its decode steps go through the attention module's
forward with a DynamicCache or a StaticCache (so the package's cache hook takes part), and the table has a row per
case with a ratio per rope type."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from hf_rope_ext.attention.engine import chunk_decode
from hf_rope_ext.types import registry

ROOT = Path(__file__).resolve().parents[1]


def test_prefill_and_decode_rows_for_every_type(tmp_path):
    """Every row also names the kernels its call ran: plain's as torch's sdpa picked it, the package's pieces by
    kernel (on CPU its own kernel), in the printed table, the records and gpu_report.py's table."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_attention.py"), "--lengths", "96", "--decode", "600"]
    command += ["--decode-static", "600", "--json", str(tmp_path / "attention.json")]
    command += ["--head-dims", "64", "--dtypes", "float32", "--repeats", "1", "--steps", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    named = {
        (r["pass"], r["rope_type"]): r["kernels"]
        for r in json.loads((tmp_path / "attention.json").read_text())["records"]
    }
    assert named["prefill", "default"] == named["decode", "default"] == "sdpa:flash_attention x1"
    assert named["prefill", "rerope"].startswith("cpu_flash x") and named["decode", "rerope"] == "cpu_flash x2"
    assert named["prefill", "xpos"] == "sdpa:flash_attention x1"  # one sdpa call: no piece
    assert "| rerope | " in out and "| cpu_flash x2 |" in out  # the printed table's kernels column
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_report.py"), str(tmp_path)], check=True, env=env)
    assert "| decode | 600 | float32 | rerope | cpu_flash x2 |" in (tmp_path / "gpu.md").read_text()
    summary = out.split("x plain sdpa: time")[1].splitlines()
    header = next(line for line in summary if line.startswith("| pass"))
    types = ("rerope", "leaky_rerope", "self_extend", "xpos", "roper", "string", "dual_chunk")
    assert header.split("|")[6:-1] == [f" {t} " for t in types]
    rows = {line.split("|")[1].strip(): line.split("|")[6:-1] for line in summary if line.startswith("| prefill")}
    rows |= {line.split("|")[1].strip(): line.split("|")[6:-1] for line in summary if line.startswith("| decode")}
    assert sorted(rows) == ["decode", "decode-static", "prefill"]
    for cells in rows.values():
        assert all(float(cell.split("/")[0]) > 0 for cell in cells)


def test_engine_check_reports_every_type_and_case_and_fails_loudly_past_its_bound(tmp_path):
    """benchmarks/check_engines.py on CPU (the CPU kernel in the CUDA kernel's place): float32 errors are tiny, and
    a bound of 0 makes every one a FAIL, exit status 1; gpu_report.py puts them in a table."""
    out = tmp_path / "engines.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "check_engines.py"), "--device", "cpu", "--length", "48"]
    command += ["--grad-length", "32", "--steps", "2", "--head-dim", "16", "--dtypes", "float32", "--fp32-bound", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1 and "errors past their bound on cpu" in result.stderr
    records = json.loads(out.read_text())["records"]
    cases = {"prefill", "padded", "flash", "flex", "decode", "backward"}
    for name in ("rerope", "leaky_rerope", "self_extend", "xpos", "roper", "string", "dual_chunk"):
        assert {r["case"] for r in records if r["rope_type"] == name} == cases
    assert all(0 <= r["error"] < 1e-5 for r in records), records
    failed = [r for r in records if r["error"] > 0]  # dual_chunk with a mask: the reference engine both ways, 0
    assert result.stdout.count("FAIL") == len(failed) >= 6 * len(cases) and len(records) == 7 * len(cases)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_report.py"), str(tmp_path)], check=True, env=env)
    table = (tmp_path / "gpu.md").read_text()
    assert "| rerope | float32 | " in table and table.count(" FAIL") == len(failed)


def test_compiled_decode_benchmark_checks_times_and_names_kernels_and_fails_loudly_past_its_bound(tmp_path):
    """benchmarks/bench_compiled_decode.py on CPU at toy sizes (dynamo's eager backend): a graphed row per type
    checked against its uncompiled step and a generate row per model type, each naming what ran; a bound of 0 makes
    the type's check (its compiled path differs from the uncompiled one in the last bits) a FAIL, exit status 3;
    gpu_report.py puts the table in gpu.md."""
    out = tmp_path / "compiled.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_compiled_decode.py"), "--device", "cpu"]
    command += ["--cached", "40", "--head-dim", "16", "--steps", "1", "--warmup", "1", "--types", "self_extend"]
    command += ["default_gqa", "--model-types", "rerope", "default_gqa", "--model-shape", "toy", "--prompt", "24"]
    command += ["--new-tokens", "3"]
    command += ["--bound", "0", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 3, done.stderr[-2000:]
    records = json.loads(out.read_text())["records"]
    assert [(r["pass"], r["rope_type"]) for r in records] == [
        ("graphed", "default"), ("graphed", "self_extend"), ("graphed", "default_gqa"),
        ("generate", "default"), ("generate", "rerope"), ("generate", "default_gqa"),
    ]  # fmt: skip
    graphed = {r["rope_type"]: r for r in records if r["pass"] == "graphed"}
    assert graphed["default"]["ok"] and not graphed["self_extend"]["ok"] and graphed["self_extend"]["error"] < 2**-6
    assert graphed["default_gqa"]["error"] < 2**-6
    assert all(r["kernels"] for r in records) and all(r["tokens_per_s"] > 0 for r in records if r["pass"] == "generate")
    assert all(r["steps"] == 1 and r["ms_quartiles"] == [r["ms"]] * 2 for r in graphed.values())
    assert all(r["tokens_agree"] == 3 for r in records if r["pass"] == "generate")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_report.py"), str(tmp_path)], check=True, env=env)
    report = (tmp_path / "gpu.md").read_text()
    assert "Compiled decode" in report and "| graphed | 40 | self_extend |" in report and "FAIL" in report
    assert ", n=1) |" in report and "| graphed | 40 | default_gqa |" in report and "x GQA plain" in report


def test_compiled_decode_benchmark_reads_the_prompt_once_and_times_the_eager_step(tmp_path):
    """``--prompt-once``: one static cache per row, cropped back to the prompt less its last token before each run
    after the first; the compiled runs from the cropped cache choose the tokens the first, uncompiled run from the
    whole prompt chose, and the eager step is timed beside the compiled one; ``--rope-param`` sets a parameter of the
    rows that have it (refused without a number). Where transformers' static layers cannot be cropped
    ``--prompt-once`` is refused, naming the version."""
    from transformers.cache_utils import StaticLayer

    out = tmp_path / "once.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_compiled_decode.py"), "--device", "cpu"]
    command += ["--cached", "8", "--head-dim", "16", "--steps", "1", "--warmup", "1", "--types", "default"]
    command += ["--model-types", "self_extend", "--model-shape", "toy", "--prompt", "24", "--new-tokens", "5"]
    command += ["--repeats", "2", "--dtype", "float32", "--prompt-once", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    refused = subprocess.run([*command, "--rope-param", "window"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "--rope-param 'window': expected KEY=NUMBER" in refused.stderr
    refused = subprocess.run([*command, "--rope-param", "windw=3"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "--rope-param windw: no row has it; allowed: chunk_size" in refused.stderr
    done = subprocess.run([*command, "--rope-param", "window=3"], capture_output=True, text=True, env=env, timeout=600)
    if not hasattr(StaticLayer, "crop"):
        assert done.returncode == 2 and "--prompt-once crops a static cache; transformers" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in json.loads(out.read_text())["records"] if r["pass"] == "generate"]
    assert [r["rope_type"] for r in rows] == ["default", "self_extend"] and all(r["prompt_once"] for r in rows)
    assert [r["rope_parameters"].get("window") for r in rows] == [None, 3]  # set where the type has it
    assert all(r["tokens_agree"] == 5 and r["repeats"] == 2 for r in rows)
    assert all(r["eager_tokens_per_s"] > 0 and len(r["eager_quartiles"]) == 2 for r in rows)
    assert "; eager " in json.loads(out.read_text())["table"][-1]


def test_the_gqa_aware_plain_step_is_transformers_sdpa_step():
    """bench_compiled_decode.sdpa_gqa (each kv head read once) against transformers' sdpa (repeat_kv), masked."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_compiled_decode as decode
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((8, 3), (2, 11), (2, 11)))
    mask = torch.rand(2, 1, 3, 13, generator=g) > 0.3  # wider than the keys, as a static cache's mask may be
    mask[..., 0] = True
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 4, True, False
    expected = sdpa_attention_forward(module, q, k, v, mask[..., :11], scaling=0.3)[0]
    torch.testing.assert_close(decode.sdpa_gqa(module, q, k, v, mask, scaling=0.3)[0], expected)


def test_training_benchmark_has_a_row_per_training_free_attention_type():
    """benchmarks/bench_train_attention.py: forward and backward on PoSE positions, both engines, every type."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_train_attention.py"), "--lengths", "48"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*command, "--repeats", "1"], capture_output=True, text=True, env=env, timeout=300, check=True)
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| ") and "type" not in line]
    names = [row[0].strip() for row in rows]
    assert names == ["dual_chunk", "leaky_rerope", "rerope", "self_extend", "string"]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)


VIEWS = {"aten.slice.Tensor", "aten.alias.default", "aten.view.default", "aten.transpose.int", "aten.expand.default"}


def gpu_plans(monkeypatch) -> None:
    """Count the plans a GPU runs: a CPU step of one row reads its chunk boundary on the host
    (``chunk_decode.HOST_BANDS``), where a GPU's step reads nothing back."""
    monkeypatch.setattr(chunk_decode, "HOST_BANDS", set())


def test_a_decode_step_copies_nothing_that_grows_with_the_cache(monkeypatch):
    """benchmarks/decode_ops.py: plain sdpa's step is a few operations; every type's step runs more, and each of its
    outputs as large as the cached keys (600 tokens x 8 heads x 128) is a view, not a copy or a pass over them. A
    step reads nothing back to Python (each read a host sync on a GPU)."""
    gpu_plans(monkeypatch)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decode_ops

    plain = decode_ops.last_step_ops("default", 600, 100_000, "cpu")
    assert sum(plain.ops.values()) <= 5 and plain.syncs == 0
    with decode_ops.Counted(10) as counted:  # the host-sync count sees a value read back, not a plain operation
        assert torch.equal(torch.ones(3), torch.ones(3) + 0)
        assert bool(torch.ones(1).sum() > 0)
        assert torch.ones(2).tolist() == [1.0, 1.0]  # no dispatched operation on a CPU, a copy back on a GPU
    assert counted.syncs == 3 and sum(counted.ops.values()) > 2
    assert torch.ones(2).tolist() == [1.0, 1.0] and counted.syncs == 3  # counted inside the mode only
    for name in ("rerope", "self_extend", "xpos", "roper", "string", "dual_chunk"):
        counter = decode_ops.last_step_ops(name, 600, 100_000, "cpu")
        assert sum(counter.ops.values()) > sum(plain.ops.values())
        assert set(counter.big) <= VIEWS, (name, dict(counter.big))
        assert counter.syncs == 0, (name, counter.syncs)  # values read back to Python (DCA's chunk plan: 8 before)


def test_every_type_has_a_benchmark_row():
    """The benchmarks measure every attention-level type of the registry (a new one needs its row in TYPES)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_attention

    assert {m.name for m in registry.methods() if m.kind == "attention"} <= set(bench_attention.TYPES)


def test_an_eager_decode_step_of_a_model_reads_nothing_back_and_adds_at_most_30_operations_per_layer(monkeypatch):
    """``decode_ops.py --model``: a whole decode step of a 2-layer Llama on its rotating cache (as ``generate`` runs
    it, after 1100 tokens: past every type's window) dispatches at most 30 operations per layer more than the stock
    model's step, and reads no value back to Python (main before: 69-91 more, 2-6 reads)."""
    gpu_plans(monkeypatch)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decode_ops

    stock = sum(decode_ops.model_step_ops("default", 1100, 100_000).ops.values())
    for name in sorted(decode_ops.bench.TYPES.keys() - {"default"}):
        counter = decode_ops.model_step_ops(name, 1100, 100_000)
        assert counter.syncs == 0, (name, counter.syncs)
        assert (sum(counter.ops.values()) - stock) / 2 <= 30, (name, dict(counter.ops))


def test_an_eager_decode_step_of_a_left_padded_batch_reads_back_once_and_adds_at_most_40_operations_per_layer():
    """``decode_ops.py --model --padded 900``: a step of two rows, the first left-padded by 900 of 1100 tokens (its
    far bands empty), reads one value back beyond the stock model's (whether the mask hides only each row's first keys,
    once for all the layers) and dispatches at most 40 operations per layer more than stock (2 layers: a step's
    shared work counts half per layer); main before: 17 reads, 90-176 more operations per layer."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decode_ops

    stock = decode_ops.model_step_ops("default", 1100, 100_000, padded=900)
    for name in sorted(decode_ops.bench.TYPES.keys() - {"default"}):
        counter = decode_ops.model_step_ops(name, 1100, 100_000, padded=900)
        assert counter.syncs <= stock.syncs + 1, (name, counter.syncs, stock.syncs)
        assert (sum(counter.ops.values()) - sum(stock.ops.values())) / 2 <= 40, (name, dict(counter.ops))


@pytest.mark.parametrize("name", ["rerope", "dual_chunk"])
def test_the_cuda_kernels_block_masks_add_no_operation_to_a_decode_step(name, monkeypatch):
    """``decode_ops.py --block-masks``: a decode step's pieces cut no key, so the block masks the CUDA kernel gives
    compiled flex reuse the lists of their shape and dispatch nothing (on an H200 ReRoPE's step took 5.0 ms with masks
    built in full at every step, 2.5 ms with leaner ones: docs/results/gpu/70b52e5)."""
    gpu_plans(monkeypatch)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import decode_ops

    bare = decode_ops.last_step_ops(name, 600, 100_000, "cpu")
    masked = decode_ops.last_step_ops(name, 600, 100_000, "cpu", block_masks=True)
    assert masked.ops == bare.ops


def test_gpu_script_stops_without_cuda_and_measures_nothing(tmp_path):
    """``benchmarks/gpu.sh`` on a machine without CUDA: exit status 2, a message naming the interpreter, no OUT."""
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_QUICK": "1", "CUDA_VISIBLE_DEVICES": ""}
    script = str(ROOT / "benchmarks" / "gpu.sh")
    done = subprocess.run(["bash", script, str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "no CUDA device here" in done.stderr and sys.executable in done.stderr
    assert not out.exists()


def test_gpu_script_names_an_unknown_part_and_measures_nothing(tmp_path):
    """``GPU_PARTS`` with a part that does not exist: exit status 2 naming it and the allowed ones, no OUT."""
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_PARTS": "engines passkey"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "GPU_PARTS has 'passkey'; allowed: engines, attention, compiled, finetune, profile" in done.stderr
    assert not out.exists()


def test_the_decode_profile_covers_one_attention_call():
    """benchmarks/profile_decode.py profiles the last step's attention call alone: plain RoPE's one sdpa call, and
    ReRoPE's two (its near and far bands), on the CPU's flash op."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import profile_decode

    flash = "aten::_scaled_dot_product_flash_attention_for_cpu"
    for name, calls in (("default", 1), ("rerope", 2)):
        seconds, prof = profile_decode.profiled_step(name, 600, 2, "cpu")
        counts = {e.key: e.count for e in prof.key_averages()}
        assert seconds > 0 and counts[flash] == calls, (name, counts)
        text = profile_decode.summary(name, seconds, prof, "cpu", 3)
        assert f"## {name}: wall" in text and "by self_cpu_time_total:" in text and "self_device" not in text


def test_the_prefill_count_takes_the_cuda_plan_and_names_what_grows(capsys):
    """``benchmarks/prefill_ops.py``: by default a band is one piece however long (the CUDA path's plan, its block
    masks built), so ReRoPE's prefill runs fewer operations than under the CPU's row blocks, and the table names the
    operation kinds whose count grows with the length."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import prefill_ops

    whole = sum(prefill_ops.prefill_ops("rerope", 1024, 16).ops.values())
    blocks = sum(prefill_ops.prefill_ops("rerope", 1024, 16, cpu_pieces=True).ops.values())
    assert whole < blocks, (whole, blocks)  # 1024 rows, window 512: 8 near blocks on the CPU, one band on CUDA
    assert prefill_ops.growth(Counter({"aten.a": 1, "aten.b": 2}), Counter({"aten.a": 4, "aten.b": 2})) == "a 1->4"
    assert prefill_ops.main(["--lengths", "600", "1200", "--types", "rerope", "--head-dim", "16"]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    cells = row.strip("|").split(" | ")  # type, two lengths, syncs, what grows: nothing below a rotation's 2048 rows
    assert cells[0].strip() == "rerope" and cells[1] == cells[2] and cells[4].strip() == "-", row
