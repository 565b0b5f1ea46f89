"""``hf-rope-ext finetune`` takes its options from :class:`FinetuneConfig`'s fields: one flag per field, the field's
default as the flag's, and every flag's value lands in its own field (checked against literal command lines)."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import hf_rope_ext.train
from hf_rope_ext.cli import build_parser, parse
from hf_rope_ext.cli.finetune import config_of
from hf_rope_ext.store.bundled import default_model_path
from hf_rope_ext.train import FinetuneConfig

RENAMED = {"rope_extra": "--rope-param"}  # fields whose flag is not --field-name
NOT_FIELDS = {"-h", "--help", "--no-progress"}
REQUIRED = ["--out", "runs/x", "--rope-type", "yarn", "--length", "256"]
BUNDLED = str(default_model_path())

# field -> (its flag with a value other than the default, the value the field must then hold)
GIVEN = {
    "model": (["--model", BUNDLED], BUNDLED),
    "out": (["--out", "runs/y"], "runs/y"),
    "rope_type": (["--rope-type", "ntk"], "ntk"),
    "length": (["--length", "512"], 512),
    "max_steps": (["--max-steps", "3"], 3),
    "factor": (["--factor", "4"], 4.0),
    "rope_extra": (
        ["--rope-param", "beta_fast=16", "--rope-param", "truncate=false"],
        {"beta_fast": 16, "truncate": False},
    ),
    "data": (["--data", "a.txt", "b/"], ["a.txt", "b/"]),
    "eval_data": (["--eval-data", "c.txt"], ["c.txt"]),
    "text_column": (["--text-column", "body"], "body"),
    "packing": (["--packing", "chunk"], "chunk"),
    "stages": (["--stages", "128:1,256:2"], [(128, 1), (256, 2)]),
    "position_schedule": (["--position-schedule", "pose"], "pose"),
    "window": (["--window", "64"], 64),
    "pose_chunks": (["--pose-chunks", "3"], 3),
    "retrieval": (["--retrieval", "0.25"], 0.25),
    "retrieval_keys": (["--retrieval-keys", "4"], 4),
    "retrieval_same_kind": (["--retrieval-same-kind", "0.5"], 0.5),
    "rank": (["--rank", "4"], 4),
    "alpha": (["--alpha", "8"], 8.0),
    "dropout": (["--dropout", "0.1"], 0.1),
    "target_modules": (["--target-modules", "q_proj,v_proj"], ("q_proj", "v_proj")),
    "train_embeddings": (["--train-embeddings"], True),
    "train_norms": (["--train-norms"], True),
    "lr": (["--lr", "1e-3"], 1e-3),
    "warmup_steps": (["--warmup-steps", "5"], 5),
    "scheduler": (["--scheduler", "linear"], "linear"),
    "weight_decay": (["--weight-decay", "0.01"], 0.01),
    "batch_size": (["--batch-size", "2"], 2),
    "grad_accum": (["--grad-accum", "4"], 4),
    "grad_checkpointing": (["--grad-checkpointing"], True),
    "offload_checkpoints": (["--offload-checkpoints"], True),
    "tiled_mlp": (["--tiled-mlp", "512"], 512),
    "no_copies": (["--no-copies"], True),
    "sequence_parallel": (["--sequence-parallel", "2"], 2),
    "precision": (["--precision", "bf16"], "bf16"),
    "seed": (["--seed", "7"], 7),
    "save_every": (["--save-every", "10"], 10),
    "resume_from": (["--resume-from", "runs/y/checkpoints/step-000010"], "runs/y/checkpoints/step-000010"),
    "merge": (["--merge"], True),
    "log_dir": (["--log-dir", "logs"], "logs"),
    "eval_lengths": (["--eval-lengths", "64,128"], [64, 128]),
    "eval_rows": (["--eval-rows", "2"], 2),
    "passkey_depths": (["--passkey-depths", "3"], 3),
    "eval_far_context": (["--eval-far-context"], True),
}
# flag -> the default its help shows (the others show none, or say in words what happens without them)
HELP_DEFAULTS = {
    "--text-column": "text",
    "--packing": "pack",
    "--position-schedule": "contiguous",
    "--pose-chunks": "2",
    "--retrieval": "0.0",
    "--retrieval-keys": "3",
    "--retrieval-same-kind": "0.0",
    "--rank": "8",
    "--alpha": "16.0",
    "--dropout": "0.0",
    "--target-modules": "q_proj,k_proj,v_proj,o_proj",
    "--lr": "0.0002",
    "--warmup-steps": "0",
    "--scheduler": "cosine",
    "--weight-decay": "0.0",
    "--batch-size": "1",
    "--grad-accum": "1",
    "--sequence-parallel": "1",
    "--precision": "auto",
    "--seed": "0",
    "--save-every": "0",
    "--eval-rows": "4",
    "--passkey-depths": "0",
}


def finetune_parser():
    return build_parser().commands["finetune"]


def flag(name: str) -> str:
    return RENAMED.get(name, "--" + name.replace("_", "-"))


def default(field):
    return field.default if field.default_factory is MISSING else field.default_factory()


def test_every_field_has_exactly_one_flag_and_every_flag_a_field():
    actions = finetune_parser()._actions
    for field in fields(FinetuneConfig):
        assert sum(flag(field.name) in action.option_strings for action in actions) == 1, field.name
    flags = {option for action in actions for option in action.option_strings} - NOT_FIELDS
    assert flags == {flag(field.name) for field in fields(FinetuneConfig)}


def test_every_flag_defaults_to_its_field():
    actions = {action.option_strings[0]: action for action in finetune_parser()._actions}
    for field in fields(FinetuneConfig):
        action = actions[flag(field.name)]
        if field.name == "model":  # no flag: the bundled model
            assert action.default is None and not action.required
        elif default(field) is MISSING:
            assert action.required, field.name
        elif field.name == "rope_extra":  # KEY=VALUE pairs, none by default
            assert action.default == [] and default(field) == {}
        else:
            assert action.default == default(field) and type(action.default) is type(default(field)), field.name


def test_a_command_line_without_options_is_the_config_of_the_fields_defaults():
    cfg = config_of(parse(build_parser(), ["finetune", *REQUIRED, "--max-steps", "1"]))
    assert cfg == FinetuneConfig(model=BUNDLED, out="runs/x", rope_type="yarn", length=256, max_steps=1)


def test_every_flag_reaches_its_field():
    assert set(GIVEN) == {field.name for field in fields(FinetuneConfig)}
    argv = [word for words, _ in GIVEN.values() for word in words]
    cfg = config_of(parse(build_parser(), ["finetune", *argv]))
    for field in fields(FinetuneConfig):
        value, expected = getattr(cfg, field.name), GIVEN[field.name][1]
        assert value == expected and type(value) is type(expected), field.name
        assert field.name == "model" or value != default(field), field.name


def test_help_shows_each_default_as_written_on_the_command_line():
    parser = finetune_parser()
    for action in parser._actions:
        formatter = parser._get_formatter()  # the lines of this one option in --help
        formatter.add_argument(action)
        text, shown = formatter.format_help(), HELP_DEFAULTS.get(action.option_strings[-1])
        end = f"(default: {shown})" if shown else action.help
        assert "".join(text.split()).endswith("".join(end.split())), text  # spaces apart (lines wrap at hyphens)


def test_the_public_names_of_train_load_on_first_use():
    """They load lazily (``finetune --help`` reads the config without torch), the function ``finetune`` over its
    module's name."""
    for name in hf_rope_ext.train.__all__:
        assert not inspect.ismodule(getattr(hf_rope_ext.train, name)), name
    from hf_rope_ext.train import finetune

    assert inspect.isfunction(finetune) and finetune.__module__ == "hf_rope_ext.train.job"
