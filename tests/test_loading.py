"""How each process gets the base model (``train.loading``): FSDP2 with CPU-RAM-efficient loading over several processes
reads it once (the engine accelerate runs says so, nothing else does; the Accelerator comes first when the launcher
asks for FSDP or DeepSpeed); a process that does not read builds it on the meta device with the reader's buffers (the
rotary frequencies of the rope type asked); what would run the model before ``prepare`` (the fp16 range check) runs
on the prepared model and still refuses an fp16 overflow. ZeRO-3 with its ``zero3_init_flag`` partitions as it loads;
on such runs the far-context baseline runs in host memory. The launched runs (tests/test_fsdp.py,
tests/test_sequence_parallel.py, tests/test_deepspeed.py) check which process read and what each holds."""

from types import SimpleNamespace

import pytest
import torch
from conftest import byte_llama_config, save_byte_llama
from transformers import AutoModelForCausalLM

from hf_rope_ext.train import loading, measure
from hf_rope_ext.train.job import on_prepared
from hf_rope_ext.train.model import extended_config

META = torch.device("meta")  # an accelerator device that is not the CPU


def fsdp_accelerator(processes=2, fsdp2=True, efficient=True):
    """The parts of an Accelerator that ``train.loading`` reads under FSDP: process count, engine, plugin."""
    state = SimpleNamespace(fsdp_plugin=SimpleNamespace(cpu_ram_efficient_loading=efficient), deepspeed_plugin=None)
    return SimpleNamespace(num_processes=processes, is_fsdp2=fsdp2, state=state, device=META)


FSDP2_ONCE = fsdp_accelerator()


@pytest.mark.parametrize(
    "accelerator, expected",
    [
        (FSDP2_ONCE, True),
        (fsdp_accelerator(processes=1), False),
        (fsdp_accelerator(fsdp2=False), False),  # FSDP1, or FSDP asked where accelerate runs DDP
        (fsdp_accelerator(efficient=False), False),
        (None, False),  # no engine asked: the Accelerator comes after the model
    ],
)
def test_only_fsdp2_with_efficient_loading_over_several_processes_reads_once(accelerator, expected):
    assert loading.reads_once(accelerator) is expected


@pytest.mark.parametrize("launched", [{}, {"ACCELERATE_USE_FSDP": "true"}, {"ACCELERATE_USE_DEEPSPEED": "true"}])
def test_the_accelerator_comes_first_when_fsdp_or_deepspeed_is_asked(monkeypatch, launched):
    for key in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(key, raising=False)
    for key, value in launched.items():
        monkeypatch.setenv(key, value)
    assert loading.engine_first() is bool(launched)


@pytest.mark.parametrize("rope_type", ["yarn", "self_extend"])
def test_a_process_that_does_not_read_holds_no_weights_and_the_readers_buffers(tmp_path, rope_type):
    save_byte_llama(tmp_path, 32)
    config = extended_config(str(tmp_path), rope_type, 128, 4.0 if rope_type == "yarn" else None, {})
    states = [SimpleNamespace(is_main_process=main, device=torch.device("cpu")) for main in (True, False)]
    reader, other = (loading.base_model(str(tmp_path), config, "fp32", "sdpa", s, FSDP2_ONCE) for s in states)
    assert all(not p.is_meta for p in reader.parameters()) and all(p.is_meta for p in other.parameters())
    assert [n for n, _ in reader.named_parameters()] == [n for n, _ in other.named_parameters()]
    buffers = dict(reader.named_buffers())
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in other.named_buffers())


def test_the_fp16_check_of_a_run_that_reads_once_runs_on_the_prepared_model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(byte_llama_config())
    model.get_input_embeddings().weight.data *= 1e7  # |w| ~ 2e5 > 65504
    measured = []
    job = SimpleNamespace(
        accelerator=SimpleNamespace(num_processes=2, unwrap_model=lambda m: m),
        fp16_row=torch.arange(8)[None],
        measure=lambda label, *models: measured.append(label),
    )
    with pytest.raises(ValueError, match="use --precision bf16"):
        on_prepared(job)(model)
    job.fp16_row = None
    on_prepared(job)(model)
    assert measured == ["before"]
    job.accelerator.num_processes = 1
    assert on_prepared(job) is None  # one process: the before figures were read at load


def deepspeed_accelerator(processes=2, zero3=True, flag=True):
    """The parts of an Accelerator that ``train.loading`` reads: process count and DeepSpeed plugin."""
    config = SimpleNamespace(is_zero3=lambda: zero3)
    plugin = SimpleNamespace(hf_ds_config=config, zero3_init_flag=flag)
    return SimpleNamespace(num_processes=processes, state=SimpleNamespace(deepspeed_plugin=plugin), device=META)


@pytest.mark.parametrize(
    "accelerator, expected",
    [
        (deepspeed_accelerator(), True),
        (deepspeed_accelerator(flag=False), False),
        (deepspeed_accelerator(zero3=False), False),
        (deepspeed_accelerator(processes=1), False),
        (SimpleNamespace(num_processes=2, state=SimpleNamespace(deepspeed_plugin=None)), False),
        (None, False),
    ],
)
def test_only_zero3_with_its_init_flag_over_several_processes_partitions_at_load(accelerator, expected):
    assert loading.partitions_at_load(accelerator) is expected


def test_the_far_context_baseline_runs_in_host_memory_where_no_device_holds_the_whole_model():
    assert measure.baseline_device(deepspeed_accelerator(flag=False)) == torch.device("meta")  # its device
    assert measure.baseline_device(deepspeed_accelerator()) == torch.device("cpu")
    assert measure.baseline_device(FSDP2_ONCE) == torch.device("cpu")
    assert measure.baseline_device(fsdp_accelerator(fsdp2=False)) == META
