"""benchmarks/bench_attention.py runs end to end on small sizes: its decode steps go through the attention module's
forward with a DynamicCache or a StaticCache (so the package's cache hook takes part), and the table has a row per
case with a ratio per rope type."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prefill_and_decode_rows_for_every_type():
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_attention.py"), "--lengths", "96", "--decode", "600"]
    command += ["--decode-static", "600"]
    command += ["--head-dims", "64", "--dtypes", "float32", "--repeats", "1", "--steps", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    summary = out.split("x plain sdpa: time")[1].splitlines()
    header = next(line for line in summary if line.startswith("| pass"))
    assert header.split("|")[6:-1] == [f" {t} " for t in ("rerope", "leaky_rerope", "self_extend", "xpos", "roper")]
    rows = {line.split("|")[1].strip(): line.split("|")[6:-1] for line in summary if line.startswith("| prefill")}
    rows |= {line.split("|")[1].strip(): line.split("|")[6:-1] for line in summary if line.startswith("| decode")}
    assert sorted(rows) == ["decode", "decode-static", "prefill"]
    for cells in rows.values():
        assert all(float(cell.split("/")[0]) > 0 for cell in cells)
