"""Break the CUDA path on purpose, one change at a time, in a copy of the tree, and show a test catches each.

    python scripts/mutate_cuda_path.py [--only N ...] [--tests FILE ...] [--keep]

The CUDA kernel (torch's fused ops, compiled flex_attention) never runs in the tests (no GPU in CI), so they run it
through CPU twins (``tests/test_attention_engines.py``, ``tests/test_dense_ops.py``), and the compiled decode step
through its path run uncompiled (``tests/test_traced_step.py``); a twin that ignored the block lists let wrong lists
pass every test. Each mutation below replaces one exact fragment of a package module (it must occur exactly once, so
the script fails loudly when the code moves on); the tests then run in the copy with ``pytest -x``. The script prints,
per mutation, the first test that failed ("caught") or "SURVIVED", and exits 1 if any survived or if the unchanged
copy fails.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEX = "hf_rope_ext/attention/engine/flex.py"
PIECES = "hf_rope_ext/attention/engine/piece.py"
MASKS = "hf_rope_ext/attention/mask_formats.py"
KERNELS = "hf_rope_ext/attention/engine/kernels.py"
SINGLE = "hf_rope_ext/attention/engine/single_band.py"
FUSED = "hf_rope_ext/attention/engine/dense_ops.py"
STEP = "hf_rope_ext/attention/engine/traced_step.py"
TURNED = "hf_rope_ext/attention/engine/traced_scores.py"
TESTS = [
    "tests/test_attention_engines.py",
    "tests/test_attention_implementations.py",
    "tests/test_dense_ops.py",
    "tests/test_traced_step.py",
]

# (what it breaks, module, fragment, replacement)
MUTATIONS = [
    (
        "partly and fully listed blocks swapped",
        FLEX,
        "*ordered(partly),\n        *ordered(fully),",
        "*ordered(fully),\n        *ordered(partly),",
    ),
    (
        "block lists sorted in reverse (unlisted blocks first)",
        FLEX,
        "torch.argsort((~blocks).to",
        "torch.argsort((blocks).to",
    ),
    ("fully listed: largest <= high (off by one)", FLEX, "(largest < piece.high)", "(largest <= piece.high)"),
    ("fully listed: smallest > low (off by one)", FLEX, "(smallest >= piece.low)", "(smallest > piece.low)"),
    ("partly listed: largest > low (off by one)", FLEX, "(largest >= piece.low)", "(largest > piece.low)"),
    ("a row block's last row one too far", FLEX, "(a0 + BLOCK).clamp(max=rows) - 1", "(a0 + BLOCK).clamp(max=rows)"),
    (
        "a column block's last column one too far",
        FLEX,
        "(j0 + BLOCK).clamp(max=columns) - 1",
        "(j0 + BLOCK).clamp(max=columns)",
    ),
    (
        "one listed block too few per row",
        FLEX,
        "count = blocks.sum(-1, dtype=torch.int32)",
        "count = (blocks.sum(-1, dtype=torch.int32) - 1).clamp(min=0)",
    ),
    ("mask_mod: d > low (off by one)", FLEX, "return (d >= low) & (d < high)", "return (d > low) & (d < high)"),
    (
        "block offsets of the wrong sign",
        FLEX,
        "offset = piece.row0 - piece.column0\n    smallest",
        "offset = piece.column0 - piece.row0\n    smallest",
    ),
    (
        "a given mask's rows and columns swapped",
        FLEX,
        "rows, columns = mask.shape[2], mask.shape[3]",
        "columns, rows = mask.shape[2], mask.shape[3]",
    ),
    ("a piece reaching its high end taken as uncut", PIECES, "largest >= self.high", "largest > self.high"),
    ("flex: a BlockMask's lists ignored (mask_mod everywhere)", MASKS, "allowed = partly & modded", "allowed = modded"),
    ("flex: fully listed blocks left out", MASKS, "allowed |= spread(", "allowed &= spread("),
    ("flash: the window one key too wide", MASKS, "(distance < window)", "(distance <= window)"),
    (
        "flash: packed documents not kept apart",
        MASKS,
        "(position_ids == 0).long().cumsum(-1)",
        "(position_ids < 0).long()",
    ),
    (
        "flash: a static cache's unfilled slots kept",
        MASKS,
        "(0, kv_len - mask.shape[-1]))",
        "(0, kv_len - mask.shape[-1]), value=True)",
    ),
    (
        "flash: padding ignored",
        MASKS,
        "allowed = allowed & keep[:, None, None, :]",
        "allowed = allowed | ~keep[:, None, None, :].any()",
    ),
    (
        "CUDA plan: bands cut into row blocks as on CPU",
        KERNELS,
        "BAND_PARTS)) if device.type in WHOLE_BANDS",
        "BAND_PARTS)) if False",
    ),
    ("gradients through torch's sdpa (one-band types)", SINGLE, "and offset == 0 and not grad:", "and offset == 0:"),
    (
        "compiled flex under dynamo's default recompile limit (unfused past 8 variants)",
        FLEX,
        "return flex_kernel(with_recompile_limit(torch.compile(flex_attention, dynamic=True)))",
        "return flex_kernel(torch.compile(flex_attention, dynamic=True))",
    ),
    (
        "no block mask for a piece that cuts nothing (compiled flex's slow path on a decode step)",
        FLEX,
        "        return tensor_block_mask(piece.mask, batch)\n",
        "        return tensor_block_mask(piece.mask, batch)\n"
        "    if not piece.cuts(rows, columns):\n        return None\n",
    ),
    (
        "the backward's lists by key block never built",
        FLEX,
        "compute_q_blocks=backward,",
        "compute_q_blocks=False,",
    ),
    ("the kernel asks for no backward lists", FLEX, "q.device, needs_grad(q, k, v))", "q.device)"),
    (
        "every piece given the full lists (the cut test skipped)",
        FLEX,
        "if not piece.cuts(rows, columns):  # every block full",
        "if True:  # every block full",
    ),
    ("full lists one key block short", FLEX, "counts + column_blocks, indices", "counts + column_blocks - 1, indices"),
    ("full lists made as inference tensors", FLEX, "torch.inference_mode(False)", "torch.inference_mode(True)"),
    (
        "full lists of every shape kept (a prefill's too)",
        FLEX,
        "(kept_full_block_lists if rows <= BLOCK else full_block_lists)(",
        "(kept_full_block_lists)(",
    ),
    (
        "the backward's lists never built for a piece that cuts nothing",
        FLEX,
        "seq_lengths=(rows, columns), compute_q_blocks=backward\n",
        "seq_lengths=(rows, columns), compute_q_blocks=False\n",
    ),
    ("full lists aliased (partial indices the full ones)", FLEX, "counts, indices.clone(),", "counts, indices,"),
    ("fused ops: cuDNN's lse [B, H, c, 1] taken as it is", FUSED, "lse.reshape(q.shape[:3])", "lse"),
    ("fused ops: the efficient op's padded lse rows kept", FUSED, "lse[..., : q.shape[2]]", "lse"),
    ("fused ops: a causal piece taken when not square", FUSED, "True if rows == columns and", "True if"),
    (
        "fused ops: a causal piece run as a rectangle",
        FUSED,
        "OPS[backend](q, k, v, causal, scale)\n",
        "OPS[backend](q, k, v, False, scale)\n",
    ),
    (
        "fused ops: pieces with autograd taken (no lse gradient)",
        FUSED,
        "causal is None or needs_grad(q, k, v)",
        "causal is None",
    ),
    ("fused ops: sdpa's choice asked without grouped heads", FUSED, "enable_gqa=gqa", "enable_gqa=False"),
    ("fused ops: the lse check's causal scores one key wide", FUSED, ".triu(1)", ".triu(2)"),
    ("fused ops: the lse check kept across causal flags", FUSED, "key = (backend, causal,", "key = (backend,"),
    ("a long band on CUDA kept one piece", KERNELS, "max(WHOLE_ROWS, -(-total // BAND_PARTS))", "2**62"),
    ("compiled step: the near band's slots one key too old", STEP, "- torch.arange(n,", "- 1 - torch.arange(n,"),
    ("compiled step: the far part from the near span's edge on", STEP, "call.k_pos >= span", "call.k_pos > span"),
    ("compiled step: Dual Chunk's near span one chunk", STEP, "return 2 * form.chunks(", "return form.chunks("),
    ("compiled step: a repeated near slot kept", STEP, "rank >= 1", "rank >= 0"),
    ("compiled step: the near band's mask not applied", STEP, "else mask_at(mask, slots)", "else None"),
    ("compiled step: the slot after a hole taken", STEP, "rank.clamp(min=1))", "rank.clamp(min=1), right=True)"),
    ("turned scores: the sine term's sign", TURNED, "sin * (q2 * k1 - q1 * k2)", "sin * (q1 * k2 - q2 * k1)"),
    (
        "turned scores: the dims past the rotary ones left out",
        TURNED,
        "scores = scores + (q[",
        "scores = scores + 0 * (q[",
    ),
    ("turned scores: xPos's key factors dropped", STEP, "call.inv_freq, log_scale)", "call.inv_freq, None)"),
    ("turned values: turned the other way", TURNED, "(v1 * cos - v2 * sin)", "(v1 * cos + v2 * sin)"),
    (
        "turned values: RoPER's output not turned back",
        STEP,
        "return turn_output_back(call, out, slice(0, 1))",
        "return out",
    ),
]


def copy_tree(to: Path) -> None:
    """The working tree as git sees it (tracked and untracked files, not ignored ones) under ``to``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def apply(tree: Path, module: str, fragment: str, replacement: str) -> str:
    """Replace the fragment in the copy; returns the module's original text."""
    path = tree / module
    text = path.read_text(encoding="utf-8")
    if text.count(fragment) != 1:
        raise SystemExit(f"mutate_cuda_path: {fragment!r} occurs {text.count(fragment)} times in {module}, not once")
    path.write_text(text.replace(fragment, replacement), encoding="utf-8")
    return text


def first_failure(tree: Path, tests: list[str]) -> str | None:
    """The first failing test of ``pytest -x`` in the copy (None: all passed)."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--durations=0", *tests]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)
    return found.group(1) if found else f"pytest exit {result.returncode}: {result.stdout[-300:]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=int, nargs="+", help="run these mutations only (1-based numbers)")
    parser.add_argument("--tests", nargs="+", default=TESTS, help="test files to run (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the copy and print where it is")
    args = parser.parse_args(argv)
    chosen = [(n, m) for n, m in enumerate(MUTATIONS, 1) if not args.only or n in args.only]
    tree = Path(tempfile.mkdtemp(prefix="hf-rope-ext-mutants-"))
    try:
        copy_tree(tree)
        baseline = first_failure(tree, args.tests)
        if baseline is not None:
            print(f"the unchanged copy fails {baseline}: fix that first")
            return 1
        survived = 0
        for number, (what, module, fragment, replacement) in chosen:
            original = apply(tree, module, fragment, replacement)
            caught = first_failure(tree, args.tests)
            (tree / module).write_text(original, encoding="utf-8")
            survived += caught is None
            print(f"{number:2d}. {what}: {'caught by ' + caught if caught else 'SURVIVED'}", flush=True)
        print(f"{len(chosen) - survived} of {len(chosen)} mutations caught by {' '.join(args.tests)}")
        return 1 if survived else 0
    finally:
        print(f"copy kept at {tree}") if args.keep else shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
