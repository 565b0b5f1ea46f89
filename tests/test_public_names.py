"""The names others rely on, pinned: the package's public names (``hf_rope_ext.__all__``, those of ``eval`` and
``train``, the table's ``register``), the subcommands of ``hf-rope-ext`` and the modules run with ``python -m``.
Moving a module must leave every one of them where it was; a name added or removed is a decision, made here."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import hf_rope_ext

ROOT_NAMES = [
    "__version__", "available_rope_types", "cache_keyword", "convert_layout", "export", "get_method", "rope_cache",
    "rope_parameters_for",
]  # fmt: skip
EVAL_NAMES = [
    "EvalPlan", "compose", "evaluate", "evaluate_model", "far_context_ratio", "last_chunk_losses", "load_model",
    "load_token_documents", "load_tokenizer", "markdown_table", "needle_grid", "parse_rope_params",
    "passkey_accuracy", "pivot_table", "plot_heatmap", "plot_perplexity", "requested_parameters", "resolve_files",
    "sliding_window_baseline", "sliding_window_losses", "token_losses", "tokenize_pieces", "truncated_perplexity",
    "write_json",
]  # fmt: skip
TRAIN_NAMES = [
    "FinetuneConfig",
    "SCHEDULES",
    "bundle_adapter",
    "finetune",
    "load_adapter",
    "parse_stages",
    "position_ids",
]
TABLE_NAMES = ["available_rope_types", "get_method", "methods", "register", "validate", "RopeParameterError"]
COMMANDS = ["list", "eval", "extend", "convert-layout", "finetune", "export", "push", "get-smollm2", "gguf", "plan"]
MODULES_RUN = ["hf_rope_ext", "hf_rope_ext.lm_eval"]


@pytest.mark.parametrize(
    ("module", "names"),
    [("hf_rope_ext", ROOT_NAMES), ("hf_rope_ext.eval", EVAL_NAMES), ("hf_rope_ext.train", TRAIN_NAMES)],
)
def test_public_names_are_exactly_these_and_resolve(module, names):
    found = importlib.import_module(module)
    assert sorted(found.__all__) == sorted(names)
    assert all(getattr(found, name, None) is not None for name in names)


def test_the_table_keeps_its_names_and_the_root_reads_the_same_table():
    from hf_rope_ext.types import registry

    assert all(callable(getattr(registry, name)) for name in TABLE_NAMES)
    assert hf_rope_ext.available_rope_types() == registry.available_rope_types()
    assert hf_rope_ext.get_method("ntk") is registry.get_method("ntk")


def test_the_command_lists_these_subcommands():
    from hf_rope_ext.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert list(sub.choices) == COMMANDS


@pytest.mark.parametrize("module", MODULES_RUN)
def test_modules_run_with_python_m_answer_help(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
