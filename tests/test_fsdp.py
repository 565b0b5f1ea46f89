"""FSDP2 on CPU processes: two gloo processes on accelerate's own FSDP2 path (``fully_shard``, launched with the shipped
``examples/accelerate/fsdp.yaml``; tests/fsdp_on_cpu.py sets accelerate's shared state as a GPU launch would) train
the one-process adapter with gradient accumulation, PoSE positions, trained norms and activation checkpointing; each
checkpoint holds the trainable tensors and their optimizer state only, never the frozen base; a resume from a middle
checkpoint gives the uninterrupted adapter; the final adapter is written once, by the main process. A process SIGKILLed
between two checkpoints (tests/kill_process.py) leaves a run that the command resumes, from the last complete
checkpoint in the partial folder, to the uninterrupted adapter and losses."""

import re
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
    assert_read_once,
    assert_same_figures,
    base_and_text,
    launch,
    log_rows,
    one_process_gaps,
)
from safetensors.torch import load_file

from hf_rope_ext.train import FinetuneConfig
from hf_rope_ext.train.checkpoints import keep_trainable_only, latest_checkpoint
from hf_rope_ext.train.config import check_output

FSDP = ("--config_file", str(ROOT / "examples" / "accelerate" / "fsdp.yaml"))  # FSDP2, one decoder layer per unit
PROGRAM = (str(Path(__file__).with_name("fsdp_on_cpu.py")), "finetune")
KILL = str(Path(__file__).with_name("kill_process.py"))
RUN = dict(OPTIONS, save_every=1, grad_checkpointing=True)
EVALUATED = dict(RUN, **EVALUATION)  # the two-process run evaluates before and after, on the sharded model
LOSS_ATOL = 1e-5  # per-step loss, 2 FSDP processes against 1 (fp32: summation order only; measured 5e-7)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved 2-layer Llama with a byte-level tokenizer, and three text files (about 15k tokens)."""
    return base_and_text(tmp_path_factory.mktemp("fsdp"))


def launch_fsdp(setup, out: Path, *engine: str, **overrides):
    """Two FSDP2 processes running ``finetune`` with RUN's options; each reports the engine accelerate gave it."""
    done = launch(argv(setup, out, **{**RUN, "batch_size": 2, **overrides}), engine=FSDP + engine, program=PROGRAM)
    assert done.stdout.count("engine: FSDP fsdp2=True") == 2, done.stdout[-2000:]  # not turned into DDP
    assert done.stdout.count("adapter:") == 1  # the command's report, from the main process only
    assert_read_once(done.stdout, 2)  # the main process alone reads the checkpoint
    return done


@pytest.fixture(scope="module")
def two(setup):
    out = setup / "two"
    launch_fsdp(setup, out, **EVALUATION)
    return out


def trainable_names(checkpoint: Path) -> list[str]:
    """The checkpoint's tensor names as the adapter file names them (peft drops the adapter and wrapper names)."""
    names = load_file(checkpoint / "model.safetensors").keys()
    return sorted(n.replace("modules_to_save.", "").replace(".default", "") for n in names)


def test_two_fsdp_processes_train_the_one_process_adapter(setup, two):
    difference, loss_difference = one_process_gaps(setup, two, EVALUATED, batch_size=4)  # the same global batch
    assert_same_figures(Path(f"{two}-one"), two)  # --eval-lengths on the sharded model
    print(f"FSDP2: max |adapter(2) - adapter(1)| = {difference:.3g}, max |loss(2) - loss(1)| = {loss_difference:.3g}")
    assert difference <= ATOL and loss_difference <= LOSS_ATOL


def test_the_fsdp_config_run_as_ddp_reads_the_model_on_every_process_and_trains(setup):
    """Where accelerate runs the shipped FSDP2 config as DDP (no GPU, and not tests/fsdp_on_cpu.py's shared state), no
    process may be left with the meta weights of a run that reads once: every process reads, and the run trains the
    one-process adapter."""
    out = setup / "as-ddp"
    done = launch(argv(setup, out, **{**RUN, "max_steps": 2, "batch_size": 2}), engine=FSDP)
    assert "FSDP asked, accelerate runs MULTI_CPU" in done.stderr
    difference, loss_difference = one_process_gaps(setup, out, dict(RUN, max_steps=2), batch_size=4)
    assert difference <= ATOL and loss_difference <= LOSS_ATOL


def test_fsdp_checkpoints_hold_the_trainable_tensors_only(setup, two):
    """Every checkpoint: the adapter's tensors (no frozen base, in no file), AdamW's two moments of exactly those."""
    final = adapter(two)
    for step in range(1, 5):
        checkpoint = two / "checkpoints" / f"step-{step:06d}"
        assert sorted(p.name for p in checkpoint.iterdir()) == [
            "model.safetensors",
            "optimizer_0",  # the optimizer's shards (torch.distributed.checkpoint, SHARDED_STATE_DICT)
            "random_states_0.pkl",
            "random_states_1.pkl",
            "scheduler.bin",
            "trainer_state.json",
        ]
        assert trainable_names(checkpoint) == sorted(final)
        moments = optimizer_moments(checkpoint / "optimizer_0")
        assert moments == 2 * sum(t.numel() for t in final.values())
    model = (checkpoint / "model.safetensors").stat().st_size
    base = (setup / "base" / "model.safetensors").stat().st_size
    print(f"checkpoint model.safetensors {model} bytes, adapter {(two / 'adapter_model.safetensors').stat().st_size}")
    assert model < base / 5


def optimizer_moments(directory: Path) -> int:
    """Elements of AdamW's exp_avg and exp_avg_sq in a torch.distributed.checkpoint folder (its metadata)."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    return sum(m.size.numel() for k, m in metadata.items() if k.endswith((".exp_avg", ".exp_avg_sq")))


def test_fsdp_resume_from_a_middle_checkpoint_gives_the_uninterrupted_adapter(setup, two):
    resumed = setup / "resumed"
    launch_fsdp(setup, resumed, resume_from=two / "checkpoints" / "step-000002")
    a, b = adapter(two), adapter(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r[4] for r in log_rows(resumed)[1:]] == [r[4] for r in log_rows(two)[3:]]
    middle, last = (load_file(two / "checkpoints" / f"step-00000{s}" / "model.safetensors") for s in (2, 4))
    moved = max(float((middle[k] - v).abs().max()) for k, v in last.items())
    assert moved > 20 * ATOL  # steps 3-4 move the weights: the resumed run had to load the middle ones


def test_a_process_killed_between_checkpoints_resumes_to_the_uninterrupted_run(setup, two):
    """Rank 1 SIGKILLed once step 3 is logged, before its checkpoint: the run stays in its partial folder with step 2
    its newest complete checkpoint, which the command run again names; resumed from it with the same --out, the run
    continues there (rows 1-2 of the log kept, row 3 redone) and gives the uninterrupted adapter and losses exactly."""
    out, partial = setup / "killed", setup / ".killed.partial"
    words = argv(setup, out, **{**RUN, "batch_size": 2})
    killed = launch(words, engine=FSDP, program=(KILL, *PROGRAM), env={"KILL_STEP": "3"}, check=False)
    assert killed.returncode != 0 and "killing rank 1 at step 3" in killed.stdout, killed.stderr[-3000:]
    found = partial / "checkpoints"
    assert not out.exists() and latest_checkpoint(found) == found / "step-000002"
    assert [r[0] for r in log_rows(partial)[1:]] == ["1", "2", "3"]
    options = dict(RUN, batch_size=2, model=str(setup / "base"), data=[str(setup / "data")], out=str(out))
    with pytest.raises(FileExistsError, match=re.escape(f"--resume-from {found / 'step-000002'}")):
        check_output(FinetuneConfig(**options))  # the same command again
    launch_fsdp(setup, out, resume_from=found / "step-000002")
    a, b = adapter(two), adapter(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r[4] for r in log_rows(out)[1:]] == [r[4] for r in log_rows(two)[1:]] and not partial.exists()


def test_fsdp_full_state_dict_checkpoints_resume_exactly(setup, two):
    """With ``fsdp_state_dict_type: FULL_STATE_DICT`` accelerate writes the optimizer state whole (optimizer.bin, from
    the main process); the checkpoint still holds no frozen tensor, and a resume gives the uninterrupted adapter."""
    full, resumed = setup / "full", setup / "full-resumed"
    engine = ("--fsdp_state_dict_type", "FULL_STATE_DICT")
    launch_fsdp(setup, full, *engine, save_every=2)
    checkpoint = full / "checkpoints" / "step-000002"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == [
        "model.safetensors",
        "optimizer.bin",
        *[f"random_states_{i}.pkl" for i in (0, 1)],
        "scheduler.bin",
        "trainer_state.json",
    ]
    assert trainable_names(checkpoint) == sorted(adapter(full))
    launch_fsdp(setup, resumed, *engine, save_every=2, resume_from=checkpoint)
    a, b, c = adapter(full), adapter(resumed), adapter(two)
    assert all(torch.equal(a[k], b[k]) for k in a) and max(float((a[k] - c[k]).abs().max()) for k in a) <= ATOL


def test_the_save_hook_takes_no_weights_from_an_engine(setup):
    """Under FSDP and DeepSpeed accelerate's save_state hands the pre-save hook ``weights=[]`` (the engine writes the
    model): the hook leaves them be instead of indexing them."""
    model = torch.nn.Linear(2, 2)
    weights = []
    keep_trainable_only([model], weights, str(setup))
    assert weights == []


def test_fsdp2_with_every_memory_technique_trains_the_one_process_adapter(setup):
    """Layer inputs offloaded, the MLP in tiles and no copies, under FSDP2 (each decoder layer a unit): the adapter
    and losses of the plain one-process run."""
    out = setup / "techniques"
    launch_fsdp(setup, out, offload_checkpoints=True, tiled_mlp=16, no_copies=True)
    difference, loss_difference = one_process_gaps(setup, out, RUN, batch_size=4)
    print(f"FSDP2 + techniques: max |adapter(2) - adapter(1)| = {difference:.3g}, losses {loss_difference:.3g}")
    assert difference <= ATOL and loss_difference <= LOSS_ATOL
