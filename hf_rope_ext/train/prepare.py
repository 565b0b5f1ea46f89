"""One fine-tuning job between its checks and its outputs: accelerator, tokenizer, extended model, packed stages,
before/after measurements, and the files written at the end (adapter, config, tokenizer, card, merged model)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..publish.cards import write_model_card
from ..store.files import read_json
from ..util.quiet import enable_activation_checkpointing, peft_wrapping
from .config import MERGED_DIR, RESULTS_FILE, FinetuneConfig, training_summary
from .context_parallel import check_context_parallel
from .data import load_text, packed_stages, with_retrieval
from .loading import base_model, engine_first, shards_at_load, whole_weights
from .lora import apply_lora
from .measure import measure
from .memory.techniques import check_engine, enable_techniques, tile_model
from .model import attention_implementation, base_length, check_fp16, extended_config, resolve_precision
from .plan import plan_stages, settings_of
from .run_folder import log_dir
from .sequence_parallel import ONE, SequenceGroup, check_model, check_size, make_group
from .sharded import is_fsdp, trainable_tensors

MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


@dataclass
class Job:
    cfg: FinetuneConfig
    accelerator: object
    tokenizer: object
    config: object
    model: object
    stages: list
    datasets: list
    settings: object
    eval_documents: list | None = None  # token id tensors of the held-out text
    results: list = field(default_factory=list)
    pretrain: int = 0  # L0, the base model's length
    far_baseline: float | None = None  # the base model's sliding-window loss (eval.far_context), once measured
    sequence: SequenceGroup = ONE  # this process' sequence group (--sequence-parallel)
    fp16_row: torch.Tensor | None = None  # (1, window): the fp16 range check still to run, on the prepared model

    def attach_lora(self):
        """Wrap the model in a LoRA PeftModel (seeded, so two runs with one seed, and all processes of a run, start
        from the same adapter); then each process' RNG is seeded apart for dropout."""
        from accelerate.utils import set_seed

        set_seed(self.cfg.seed)
        cfg = self.cfg
        self.model = apply_lora(
            self.model,
            rank=cfg.rank,
            alpha=cfg.alpha,
            dropout=cfg.dropout,
            target_modules=cfg.target_modules,
            train_embeddings=cfg.train_embeddings,
            train_norms=cfg.train_norms,
        )
        if cfg.grad_checkpointing:
            enable_activation_checkpointing(self.model, use_reentrant=False)
        enable_techniques(self.model, cfg.offload_checkpoints, cfg.no_copies)
        self.model.config.use_cache = False
        set_seed(cfg.seed, device_specific=True)  # dropout: seed + process index, so processes draw their own masks
        return self.model

    def measure(self, label: str, model=None, prepared=None) -> list[dict]:
        """The evaluation harness at each --eval-lengths (``measure.measure``); records kept for the card."""
        records = measure(self, label, model or self.model, prepared)
        self.results += records
        return records

    def save(self, work: Path, model, out: Path) -> None:
        """Adapter, extended config, tokenizer, results and card into ``work`` (to become ``out``); the merged model
        on request. ``model`` is the accelerate-prepared one: its weights are gathered on every process (FSDP,
        ZeRO-3: a collective), then written by the main process alone (the others may hold none of them)."""
        acc = self.accelerator
        state = adapter_state(acc, model)
        if acc.is_main_process:
            acc.unwrap_model(model).save_pretrained(str(work), state_dict=state)
            self.config.save_pretrained(str(work))
            self.tokenizer.save_pretrained(str(work))
            (work / RESULTS_FILE).write_text(json.dumps(self.results, indent=2), encoding="utf-8")
            self.card(work, "adapter", out)
            if self.cfg.merge:
                self.merge(work, out)
        acc.wait_for_everyone()

    def merge(self, work: Path, out: Path) -> None:
        """Merge from the files just written (base in its saved dtype + adapter, on the CPU), so that sharded
        training states need no gathering and the saved adapter is what gets merged; the config keeps the rope."""
        target = work / MERGED_DIR
        with whole_weights(self.accelerator):  # the main process alone: never partitioned by ZeRO-3's zero.Init
            merged = load_adapter(str(work)).merge_and_unload()
        merged.config.use_cache = True
        merged.save_pretrained(str(target))
        self.tokenizer.save_pretrained(str(target))
        self.card(target, "extended", out / MERGED_DIR)

    def card(self, directory: Path, kind: str, final: Path) -> None:
        """The model card of ``directory``, whose snippet loads ``final`` (where the folder ends up)."""
        labelled = [{**r, "rope_type": f"{r['rope_type']} ({r['when']})"} for r in self.results]
        write_model_card(
            directory,
            kind=kind,
            model_id=str(Path(final).resolve()),
            base_model=self.cfg.model,
            rope_parameters=self.config.rope_parameters,
            rope_layout=getattr(self.config, "rope_layout", "half"),
            results=labelled or None,
            training=training_summary(self.cfg),
            notes=LOAD_NOTE if kind == "adapter" else None,
        )


def adapter_state(accelerator, model) -> dict:
    """The state dict the adapter is saved from (complete on the main process); every process must call it. Under FSDP
    the trainable tensors alone (accelerate's full state dict would gather the frozen base too); otherwise accelerate's
    (ZeRO-3: consolidated on the main process)."""
    if is_fsdp(accelerator):
        return trainable_tensors(model)
    return accelerator.get_state_dict(model)


LOAD_NOTE = (
    "The adapter folder holds the extended `config.json`. Load it with `hf_rope_ext.train.load_adapter(path)`, or "
    "as the usage snippet below does (the base model built with `config=AutoConfig.from_pretrained(path)`, then "
    "`PeftModelForCausalLM.from_pretrained`), so that the base model has the rope parameters it was fine-tuned with."
)


def launched_state():
    """accelerate's process state as launched: on CPU when asked (``--cpu``) or when several processes were started
    (torchrun, ``accelerate launch --multi_gpu``) on a machine without CUDA: DDP over gloo. A launch whose processes
    would each run alone (and write the same files) is refused."""
    import os

    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = parse_flag_from_env("ACCELERATE_USE_CPU") or (world > 1 and not torch.cuda.is_available())
    state = PartialState(cpu=cpu)
    if state.num_processes != world:
        raise ValueError(
            f"WORLD_SIZE={world} but accelerate runs {state.num_processes} process(es): each would train alone into "
            "the same files; start the processes with `accelerate launch` or `torchrun`"
        )
    if cpu and world == 1 and "MASTER_ADDR" in os.environ and state.is_main_process:
        print(CPU_LAUNCH_NOTE, file=sys.stderr)
    return state


CPU_LAUNCH_NOTE = (
    "hf-rope-ext finetune: note: one process. `accelerate launch --cpu` starts a single process unless given "
    "--mpirun_hostfile; for several CPU processes (DDP over gloo) use `accelerate launch --multi_gpu "
    "--num_processes N` on a machine without CUDA, or `torchrun --nproc_per_node N -m hf_rope_ext finetune ...`"
)


def make_accelerator(cfg: FinetuneConfig, precision: str, log_dir: Path):
    """Accelerator with the run's mixed precision and accumulation; TensorBoard tracking when it is installed.
    ``split_batches``: the loop's loader yields global micro-batches that accelerate splits over the processes;
    accumulation counts micro-batches only (an epoch's end does not cut an optimizer step short)."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import (
        DataLoaderConfiguration,
        DistributedType,
        GradientAccumulationPlugin,
        parse_flag_from_env,
    )

    tracker = "tensorboard" if importlib.util.find_spec("tensorboard") else None
    accelerator = Accelerator(
        cpu=PartialState().device.type == "cpu",
        mixed_precision=MIXED[precision],
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=cfg.grad_accum, sync_with_dataloader=False),
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        log_with=tracker,
        project_dir=str(log_dir),
    )
    if parse_flag_from_env("ACCELERATE_USE_FSDP") and accelerator.distributed_type != DistributedType.FSDP:
        if accelerator.is_main_process:  # accelerate 1.15 shards with FSDP on GPUs only; elsewhere it runs DDP
            print(
                f"hf-rope-ext finetune: note: FSDP asked, accelerate runs {accelerator.distributed_type.value}",
                file=sys.stderr,
            )
    if accelerator.gradient_accumulation_steps != cfg.grad_accum:  # a DeepSpeed config's value wins in accelerate
        raise ValueError(
            f"--grad-accum {cfg.grad_accum} but the accelerate config sets gradient_accumulation_steps="
            f"{accelerator.gradient_accumulation_steps}; make them equal"
        )
    return accelerator


def prepare_run(cfg: FinetuneConfig) -> Job:
    """Every check that can fail, in order, before anything is written: rope type and length, data, fp16 range.

    The Accelerator is created last (accelerate fixes its mixed precision once per process), except under FSDP and
    DeepSpeed, where it is created before the model, which is loaded as the engine accelerate runs needs it
    (``train.loading``).
    """
    from transformers import AutoTokenizer

    state = launched_state()  # the launcher's device and process count
    check_size(cfg.sequence_parallel, state.num_processes)
    precision = resolve_precision(cfg.precision, state.device)
    cfg.model = str(Path(cfg.model).resolve()) if Path(cfg.model).exists() else cfg.model  # recorded in the adapter
    config = extended_config(cfg.model, cfg.rope_type, cfg.length, cfg.factor, cfg.rope_extra)
    pretrain = base_length(cfg.model)
    stages = plan_stages(cfg, pretrain)
    check_far_context(cfg, pretrain)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    with state.main_process_first():  # files that datasets caches are written by the main process alone
        train_text, eval_documents = load_text(cfg, tokenizer)
    groups = state.num_processes // cfg.sequence_parallel  # data-parallel groups: each reads its own rows
    datasets = packed_stages(train_text, stages, cfg.packing, cfg.batch_size * cfg.grad_accum * groups)
    datasets = with_retrieval(datasets, tokenizer, cfg)
    logs = log_dir(cfg.out, cfg.resume_from, cfg.log_dir)
    accelerator = make_accelerator(cfg, precision, logs) if engine_first() else None  # see train.loading
    attention = attention_implementation(cfg.rope_type, state.device)
    model = base_model(cfg.model, config, precision, attention, state, accelerator)
    tile_model(model, cfg.tiled_mlp)
    check_model(model.config, cfg.sequence_parallel, [stage.window for stage in stages] + list(cfg.eval_lengths or ()))
    fp16_row = torch.tensor(datasets[0][:1]["input_ids"], device=state.device) if precision == "fp16" else None
    if fp16_row is not None and not shards_at_load(accelerator):  # else checked once prepared (job.on_prepared)
        check_fp16(model, fp16_row)
        fp16_row = None
    accelerator = accelerator or make_accelerator(cfg, precision, logs)
    check_context_parallel(accelerator, cfg.rope_type, model.config._attn_implementation, cfg.sequence_parallel)
    check_engine(accelerator, cfg.offload_checkpoints)
    sequence = make_group(cfg.sequence_parallel, state.num_processes, state.process_index)
    parts = (cfg, accelerator, tokenizer, config, model, stages, datasets, settings_of(cfg), eval_documents)
    return Job(*parts, pretrain=pretrain, sequence=sequence, fp16_row=fp16_row)


def check_far_context(cfg: FinetuneConfig, pretrain: int) -> None:
    """--eval-far-context scores the last L0 - 1 tokens of the longest eval length: it needs one length >= L0."""
    if cfg.eval_far_context and not any(n >= pretrain for n in cfg.eval_lengths or ()):
        raise ValueError(
            f"--eval-far-context needs an --eval-lengths value >= the model's length {pretrain} "
            f"(given: {cfg.eval_lengths})"
        )


def load_adapter(path, base=None, **kwargs):
    """A fine-tuned adapter on its base (``base``, else the adapter's ``base_model_name_or_path``), built with the
    adapter folder's (extended) config.json, or the base's own where the adapter has none (a ``bundle_adapter``
    folder, whose base carries the extended config)."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    base = str(base or read_json(Path(path) / "adapter_config.json")["base_model_name_or_path"])
    config = AutoConfig.from_pretrained(path if (Path(path) / "config.json").is_file() else base)
    model = AutoModelForCausalLM.from_pretrained(base, config=config, **kwargs)
    with peft_wrapping():
        return PeftModel.from_pretrained(model, str(path))
