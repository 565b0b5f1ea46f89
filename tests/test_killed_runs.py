"""A process killed outright (SIGKILL, a lost node): a checkpoint counts only once every process's part is on disk
(written aside as ``step-NNNNNN.tmp``, renamed once the main process has checked every part and written
``trainer_state.json`` last), an incomplete one is never picked nor offered, the command run again names the newest
complete checkpoint and the ``--resume-from`` that continues the run wherever the dead run left it (``--out`` or its
partial folder), and the resumed run keeps the log's rows up to that step. End to end: two torchrun processes with
``--sequence-parallel 2``, one SIGKILLed while the last checkpoint is written (tests/kill_process.py), resumed from the
last complete one, reach the adapter and losses the dead run had computed; the FSDP2 case is in tests/test_fsdp.py."""

from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType
from finetune_launch import L0, OPTIONS, argv, base_and_text, log_rows, torchrun
from safetensors.torch import load_file, save_file

from hf_rope_ext.train import FinetuneConfig, checkpoints
from hf_rope_ext.train.checkpoints import STATE_FILE, latest_checkpoint, missing_part, save_checkpoint
from hf_rope_ext.train.config import check_output
from hf_rope_ext.train.csv_log import CsvLog
from hf_rope_ext.train.run_folder import log_dir, newest_checkpoint, work_dir

KILL = str(Path(__file__).with_name("kill_process.py"))
PLAN = {"processes": 2, "batch_size": 1}
ADVICE = ("remove", "delete", "rm ")  # what a refusal must not say about a folder that holds checkpoints


class TwoProcesses:
    """What ``save_checkpoint`` asks of an Accelerator, standing for the two processes of a launch at once: its
    ``save_state`` writes the main process's files and each process's RNG state (``skip``: names it leaves out)."""

    num_processes, is_main_process, distributed_type = 2, True, DistributedType.MULTI_CPU

    def __init__(self, skip: tuple[str, ...] = ()):
        self.skip = skip

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, directory: str) -> None:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        if "model.safetensors" not in self.skip:
            save_file({"lora_A": torch.ones(2, 2)}, str(folder / "model.safetensors"))
        for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"):
            if name not in self.skip:
                torch.save({"state": name}, folder / name)


@pytest.fixture
def one_machine(monkeypatch):
    """The main process's value is every process's (no process group in this process)."""
    monkeypatch.setattr(checkpoints, "from_main", lambda _accelerator, value: value)


def written(folder: Path, *steps: int, accelerator=None) -> Path:
    """Checkpoints of ``steps`` under ``folder/checkpoints``; returns that folder."""
    for step in steps:
        save_checkpoint(accelerator or TwoProcesses(), folder / "checkpoints" / f"step-{step:06d}", step, PLAN)
    return folder / "checkpoints"


def test_a_checkpoint_is_complete_with_every_process_part_and_the_state_file(tmp_path, one_machine):
    found = written(tmp_path, 2, 4)
    last = found / "step-000004"
    assert latest_checkpoint(found) == last and missing_part(last) is None
    assert sorted(p.name for p in found.iterdir()) == ["step-000002", "step-000004"]  # nothing left aside
    (last / "random_states_1.pkl").rename(tmp_path / "aside.pkl")  # the second process's part
    assert missing_part(last) == "random_states_1.pkl" and latest_checkpoint(found) == found / "step-000002"
    (tmp_path / "aside.pkl").rename(last / "random_states_1.pkl")
    (last / "optimizer.bin").write_bytes((last / "optimizer.bin").read_bytes()[:-10])
    assert missing_part(last).startswith("optimizer.bin of ") and latest_checkpoint(found) == found / "step-000002"
    (found / "step-000002" / STATE_FILE).unlink()
    assert missing_part(found / "step-000002").startswith(STATE_FILE) and latest_checkpoint(found) is None


def test_an_unfinished_checkpoint_is_never_picked(tmp_path, one_machine):
    found = written(tmp_path / ".out.partial", 2, 4)
    (found / "step-000004").rename(found / "step-000006.tmp")  # every part and the state file, under its name aside
    assert latest_checkpoint(found) == found / "step-000002" == newest_checkpoint(tmp_path / "out")
    assert "step-000006.tmp" in missing_part(found / "step-000006.tmp")


def test_an_older_checkpoint_needs_one_rng_state_per_process_of_its_plan(tmp_path):
    """Written before the state file listed the parts: the state file and the RNG states of its plan's processes."""
    old = tmp_path / "step-000003"
    old.mkdir()
    (old / STATE_FILE).write_text('{"step": 3, "plan": {"processes": 1, "sequence_parallel": 2}}')
    (old / "random_states_0.pkl").write_bytes(b"\x80")
    assert missing_part(old) == "random_states_1.pkl"
    (old / "random_states_1.pkl").write_bytes(b"\x80")
    assert missing_part(old) is None


def test_a_part_missing_once_every_process_has_written_fails_the_save(tmp_path, one_machine):
    """A process's part not there after all have met (an output folder that is not shared): no checkpoint, an error
    naming the part; the next save of that step clears what was left."""
    target = tmp_path / "checkpoints" / "step-000002"
    with pytest.raises(FileNotFoundError, match="lacks random_states_1.pkl after every process wrote its part"):
        save_checkpoint(TwoProcesses(skip=("random_states_1.pkl",)), target, 2, PLAN)
    assert not target.exists() and latest_checkpoint(target.parent) is None
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        save_checkpoint(TwoProcesses(skip=("model.safetensors",)), target, 2, PLAN)
    save_checkpoint(TwoProcesses(), target, 2, PLAN)
    save_checkpoint(TwoProcesses(), target, 2, PLAN)  # a resumed run writes a step again: it takes the name
    assert [p.name for p in target.parent.iterdir()] == ["step-000002"] and missing_part(target) is None


def job(out: Path, **overrides) -> FinetuneConfig:
    return FinetuneConfig(model="base", out=str(out), rope_type="yarn", length=2 * L0, max_steps=4, **overrides)


def test_a_new_run_into_a_killed_runs_partial_folder_is_told_where_to_resume(tmp_path, one_machine):
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    found = written(partial, 2, 4)
    (found / "step-000004" / "random_states_1.pkl").unlink()  # the dead process never wrote it
    with pytest.raises(FileExistsError) as refused:
        check_output(job(out))
    message = str(refused.value)
    assert f"--resume-from {found / 'step-000002'}" in message and not any(w in message for w in ADVICE), message
    assert check_output(job(out, resume_from=str(found / "step-000002"))) == out  # the advice is taken
    assert work_dir(out, found / "step-000002") == partial and log_dir(out, found / "step-000002") == partial / "logs"
    assert newest_checkpoint(out) == found / "step-000002"


def test_a_new_run_into_a_stopped_runs_folder_is_told_where_to_resume(tmp_path, one_machine):
    out = tmp_path / "out"
    found = written(out, 1)
    with pytest.raises(FileExistsError) as refused:
        check_output(job(out))
    message = str(refused.value)
    assert f"--resume-from {found / 'step-000001'}" in message and not any(w in message for w in ADVICE), message
    assert work_dir(out, found / "step-000001") == out
    (out / "adapter_config.json").write_text("{}")  # finished: nothing to resume
    with pytest.raises(FileExistsError, match="exists; choose a new folder") as refused:
        check_output(job(out))
    assert "--resume-from" not in str(refused.value)


def test_a_partial_folder_without_a_complete_checkpoint_names_none(tmp_path, one_machine):
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    found = written(partial, 2)
    (found / "step-000002").rename(found / "step-000002.tmp")
    with pytest.raises(FileExistsError, match="before its first complete checkpoint") as refused:
        check_output(job(out))
    assert "--resume-from" not in str(refused.value)


def test_resuming_from_an_incomplete_checkpoint_names_the_complete_one(tmp_path, one_machine):
    out, partial = tmp_path / "out", tmp_path / ".out.partial"
    found = written(partial, 2, 4)
    (found / "step-000004" / STATE_FILE).unlink()
    with pytest.raises(ValueError, match="is not a complete checkpoint: it lacks trainer_state.json") as refused:
        check_output(job(out, resume_from=str(found / "step-000004")))
    assert f"the newest complete one beside it is {str(found / 'step-000002')!r}" in str(refused.value)
    (found / "step-000004").rename(found / "step-000004.tmp")  # as a run killed while writing it leaves it
    (found / "step-000004.tmp" / "optimizer.bin").write_bytes(b"PK")  # cut short
    with pytest.raises(ValueError, match=r"it lacks the name step-NNNNNN \(it is step-000004.tmp"):
        check_output(job(out, resume_from=str(found / "step-000004.tmp")))
    out.mkdir()  # the partial folder could not become --out
    with pytest.raises(FileExistsError, match="--out exists too"):
        check_output(job(out, resume_from=str(found / "step-000002")))


def test_a_run_resumed_in_the_partial_folder_keeps_the_rows_up_to_its_step(tmp_path):
    """The dead run logged steps 1-5 and began a sixth row; resumed at step 4 the log holds rows 1-4 as they were,
    then the resumed run's."""
    out, checkpoint = tmp_path / "out", tmp_path / ".out.partial" / "checkpoints" / "step-000004"
    logs = log_dir(out, checkpoint)
    dead = CsvLog(logs, enabled=True)
    for step in range(1, 6):
        dead.write({"step": step, "loss": 1.0 / step})
    with dead.path.open("a") as handle:
        handle.write("6,0,64")  # cut short by the kill
    kept = dead.path.read_text().splitlines(keepends=True)[:5]
    resumed = CsvLog(log_dir(out, checkpoint), enabled=True, start_step=4)
    for step in (5, 6):
        resumed.write({"step": step, "loss": 2.0})
    lines = resumed.path.read_text().splitlines(keepends=True)
    assert resumed.path.parent == tmp_path / ".out.partial" / "logs" and lines[:5] == kept
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "2", "3", "4", "5", "6"]


# end to end: torchrun, two processes, one row split over both ------------------------------------------------------

RUN = dict(OPTIONS, rope_type="self_extend", length=4 * L0, window=48, max_steps=4, save_every=2)
RUN.update(batch_size=2, sequence_parallel=2, grad_checkpointing=True, no_progress=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved 2-layer Llama (4 query, 2 key-value heads) with a byte-level tokenizer, and three text files."""
    return base_and_text(tmp_path_factory.mktemp("killed"))


def test_a_split_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(setup):
    """Rank 1 SIGKILLed while step 4's checkpoint is written (after steps 3-4 were computed and logged): the run stays
    in its partial folder with step 2 complete and step 4 unfinished (no RNG state of rank 1, no state file); the
    command run again names step 2 and the flag; resumed from it, the run redoes steps 3-4 and reaches the losses
    and the weights the dead run had computed, bit for bit, with rows 1-2 of the log as the dead run wrote them."""
    out, partial = setup / "split", setup / ".split.partial"
    command = ["-m", "hf_rope_ext", "finetune", *argv(setup, out, **RUN)]
    killed = torchrun([KILL, *command], env={"KILL_STEP": "4", "KILL_AT": "writing"}, check=False)
    assert killed.returncode != 0 and "killing rank 1 at step 4" in killed.stdout, killed.stderr[-3000:]
    assert "(SIGKILL)" in killed.stderr  # torchrun's account of rank 1
    found = partial / "checkpoints"
    assert not out.exists() and latest_checkpoint(found) == found / "step-000002"
    unfinished = sorted(p.name for p in (found / "step-000004.tmp").iterdir())
    assert "random_states_0.pkl" in unfinished and "random_states_1.pkl" not in unfinished
    assert "model.safetensors" in unfinished and STATE_FILE not in unfinished  # the main process's part: step 4
    dead_rows = log_rows(partial)
    assert [r[0] for r in dead_rows[1:]] == ["1", "2", "3", "4"]  # logged before the kill

    with pytest.raises(FileExistsError) as refused:  # the same command again
        check_output(FinetuneConfig(**config_of(setup, out)))
    message, checkpoint = str(refused.value), found / "step-000002"
    assert f"--resume-from {checkpoint}" in message and not any(w in message for w in ADVICE), message
    stamp = (checkpoint / STATE_FILE).stat().st_mtime_ns
    computed = load_file(found / "step-000004.tmp" / "model.safetensors")  # the dead run's weights after step 4

    torchrun([*command, "--resume-from", str(checkpoint)])
    assert not partial.exists() and (out / "adapter_model.safetensors").is_file()
    rows = log_rows(out)
    assert rows[:3] == dead_rows[:3] and [r[4] for r in rows[3:]] == [r[4] for r in dead_rows[3:]]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    redone = load_file(out / "checkpoints" / "step-000004" / "model.safetensors")
    assert redone.keys() == computed.keys() and all(torch.equal(redone[k], computed[k]) for k in redone)
    assert (out / "checkpoints" / "step-000002" / STATE_FILE).stat().st_mtime_ns == stamp  # resumed: not redone


def config_of(setup: Path, out: Path) -> dict:
    """RUN as FinetuneConfig's fields."""
    options = {k: v for k, v in RUN.items() if k != "no_progress"}
    return dict(options, model=str(setup / "base"), data=[str(setup / "data")], out=str(out))
