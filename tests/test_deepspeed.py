"""DeepSpeed ZeRO-3 on CPU processes: two gloo processes on accelerate's own DeepSpeed path (``deepspeed.initialize``
with ZeRO stage 3, DeepSpeed's CPU accelerator; launched with the shipped ``examples/accelerate/deepspeed_zero3.yaml``,
tests/deepspeed_on_cpu.py builds the Accelerator as a GPU launch would) train the one-process adapter with gradient
accumulation, PoSE positions, trained norms and activation checkpointing; each checkpoint holds the trainable tensors
and their optimizer state only, never the frozen base; a resume from a middle checkpoint gives the uninterrupted
adapter. Each process holds half the base model as loaded (the shipped ``zero3_init_flag: true``: partitioned as
built) or all of it (false, the resumed run); the merged model of a ZeRO-3 run equals the merge done in this process.
deepspeed is in the ``test`` extra: without it this module fails, it is not skipped."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from finetune_launch import (
    ATOL,
    EVALUATION,
    OPTIONS,
    ROOT,
    adapter,
    argv,
    assert_same_figures,
    base_and_text,
    launch,
    loaded,
    log_rows,
    one_process_gaps,
)
from safetensors.torch import load_file

from hf_rope_ext.train import FinetuneConfig, finetune, load_adapter
from hf_rope_ext.train.config import MERGED_DIR

DEEPSPEED = importlib.util.find_spec("deepspeed")
assert DEEPSPEED is not None, "tests/test_deepspeed.py needs deepspeed: pip install -e '.[test]'"
ZERO3 = ("--config_file", str(ROOT / "examples" / "accelerate" / "deepspeed_zero3.yaml"))
PROGRAM = (str(Path(__file__).with_name("deepspeed_on_cpu.py")), "finetune")
# DeepSpeed's CPU accelerator, and the launched processes import the deepspeed this test found
ENV = {
    "DS_ACCELERATOR": "cpu",
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(DEEPSPEED.submodule_search_locations[0]).parent)]),
}
RUN = dict(OPTIONS, save_every=1, grad_checkpointing=True)
EVALUATED = dict(RUN, **EVALUATION)  # the two-process run evaluates before and after, on the partitioned model
LOSS_ATOL = 1e-5  # per-step loss, 2 DeepSpeed processes against 1 (fp32: summation order only; measured 5e-7)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved 2-layer Llama with a byte-level tokenizer, and three text files (about 15k tokens)."""
    return base_and_text(tmp_path_factory.mktemp("deepspeed"))


def launch_zero3(setup, out: Path, init: bool = True, **overrides):
    """Two DeepSpeed ZeRO-3 processes running ``finetune`` with RUN's options (the config's accumulation set to
    --grad-accum's; ``init``: its ``zero3_init_flag``); each reports the engine accelerate gave it and the bytes of
    the base model it holds as loaded: half of the weights each (partitioned as built), or all of them."""
    engine = (*ZERO3, "--gradient_accumulation_steps", str(RUN["grad_accum"]), "--zero3_init_flag", str(init).lower())
    words = argv(setup, out, **{**RUN, "batch_size": 2, **overrides})
    done = launch(words, engine=engine, program=PROGRAM, env=ENV)
    assert done.stdout.count("engine: DEEPSPEED") == 2, done.stdout[-2000:]  # not turned into DDP
    assert done.stdout.count("adapter:") == 1  # the command's report, from the main process only
    whole = sum(t.numel() * t.element_size() for t in load_file(setup / "base" / "model.safetensors").values())
    held = loaded(done.stdout)
    assert held == ([whole // 2] * 2 if init else [whole] * 2), (held, whole)
    return done


@pytest.fixture(scope="module")
def two(setup):
    out = setup / "two"
    launch_zero3(setup, out, **EVALUATION)
    return out


def test_two_deepspeed_processes_train_the_one_process_adapter(setup, two):
    difference, loss_difference = one_process_gaps(setup, two, EVALUATED, batch_size=4)  # the same global batch
    assert_same_figures(Path(f"{two}-one"), two)  # --eval-lengths under ZeRO-3
    print(f"ZeRO-3: max |adapter(2) - adapter(1)| = {difference:.3g}, max |loss(2) - loss(1)| = {loss_difference:.3g}")
    assert difference <= ATOL and loss_difference <= LOSS_ATOL


def states(checkpoint: Path, rank: int, kind: str) -> dict:
    """One process' DeepSpeed ``model_states`` or ``optim_states`` file of a checkpoint (pickled DeepSpeed objects)."""
    path = checkpoint / "pytorch_model" / f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)


def adapter_name(name: str) -> str:
    """A parameter's name as the adapter file names it (peft drops the adapter and wrapper names)."""
    return name.replace("modules_to_save.", "").replace(".default", "")


def test_deepspeed_checkpoints_hold_the_trainable_tensors_only(setup, two):
    """Every checkpoint: each process' module state names the adapter's tensors only (no frozen base, which the
    engine leaves out: ``exclude_frozen_parameters``), and its optimizer partition holds half of exactly those, with
    AdamW's two moments of them."""
    final = adapter(two)
    trainable = sum(t.numel() for t in final.values())
    for step in range(1, 5):
        checkpoint = two / "checkpoints" / f"step-{step:06d}"
        assert sorted(p.name for p in checkpoint.iterdir()) == [
            "latest",
            "pytorch_model",
            "random_states_0.pkl",
            "random_states_1.pkl",
            "scheduler.bin",
            "trainer_state.json",
            "zero_to_fp32.py",
            "zero_to_torch.py",
        ]
        for rank in (0, 1):
            model = states(checkpoint, rank, "model")
            assert sorted(map(adapter_name, model["module"])) == sorted(final)
            assert [sorted(map(adapter_name, s)) for s in model["param_shapes"]] == [sorted(final)]
            assert not model["frozen_param_shapes"] and not model["frozen_param_fragments"]
            optimizer = states(checkpoint, rank, "optim")["optimizer_state_dict"]
            assert sum(g.numel() for g in optimizer["fp32_flat_groups"]) == trainable // 2
            moments = optimizer["optimizer_state_dict"]["state"].values()
            assert sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in moments) == trainable
    size = sum(p.stat().st_size for p in (checkpoint / "pytorch_model").iterdir())
    print(f"checkpoint pytorch_model/ {size} bytes, adapter {(two / 'adapter_model.safetensors').stat().st_size}")


def test_deepspeed_resume_from_a_middle_checkpoint_gives_the_uninterrupted_adapter(setup, two):
    resumed = setup / "resumed"
    # loaded whole this time (zero3_init_flag false): the partitions, and so the resumed run, are the same
    launch_zero3(setup, resumed, init=False, resume_from=two / "checkpoints" / "step-000002", merge=True)
    a, b = adapter(two), adapter(resumed)
    merged, expected = load_file(resumed / MERGED_DIR / "model.safetensors"), merge_in_process(resumed)
    assert merged.keys() <= expected.keys() and all(torch.equal(merged[k], expected[k]) for k in merged)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r[4] for r in log_rows(resumed)[1:]] == [r[4] for r in log_rows(two)[3:]]
    middle, last = (states(two / "checkpoints" / f"step-00000{s}", 0, "optim") for s in (2, 4))
    flat = [m["optimizer_state_dict"]["fp32_flat_groups"][0].detach() for m in (middle, last)]
    assert float((flat[0] - flat[1]).abs().max()) > 20 * ATOL  # steps 3-4 move the weights: the resume loaded them


def merge_in_process(out: Path) -> dict:
    """The state dict of ``out``'s adapter merged into its base in this process (no DeepSpeed)."""
    return load_adapter(str(out)).merge_and_unload().state_dict()


def test_deepspeed_with_each_row_over_both_processes_trains_the_one_process_adapter(setup):
    """``--sequence-parallel 2`` under ZeRO-3: the package's all-to-all around the attention function runs under
    DeepSpeed's engine as under DDP and FSDP2; an attention-level type, PoSE rows over both processes."""
    split = dict(rope_type="self_extend", length=128, window=48, max_steps=3, save_every=3)
    launch_zero3(setup, setup / "split", **split, sequence_parallel=2)
    options = dict(RUN, **split, model=str(setup / "base"), data=[str(setup / "data")], out=str(setup / "one-split"))
    one = finetune(FinetuneConfig(**options, batch_size=2))  # one group of two processes reads 2 rows
    a, b = adapter(setup / "one-split"), adapter(setup / "split")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= ATOL
    losses = [float(r[4]) for r in log_rows(setup / "split")[1:]]
    assert losses == pytest.approx([r["loss"] for r in one["rows"]], abs=LOSS_ATOL)
