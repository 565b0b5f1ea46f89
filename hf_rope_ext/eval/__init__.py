"""Evaluation of long-context behaviour: perplexity of truncated documents, last-chunk loss, far-context loss
against a sliding-window baseline, passkey retrieval, needle in a haystack, and reports (Markdown table, JSON
records, plots)."""

from .data import load_token_documents, resolve_files
from .far_context import far_context_ratio, sliding_window_baseline, sliding_window_losses
from .last_chunk import last_chunk_losses
from .loading import load_model, load_tokenizer, parse_rope_params, requested_parameters
from .needle import needle_grid
from .passkey import compose, passkey_accuracy, tokenize_pieces
from .perplexity import token_losses, truncated_perplexity
from .report import markdown_table, pivot_table, plot_heatmap, plot_perplexity, write_json
from .runner import EvalPlan, evaluate, evaluate_model

__all__ = [
    "EvalPlan",
    "compose",
    "evaluate",
    "evaluate_model",
    "far_context_ratio",
    "last_chunk_losses",
    "load_model",
    "load_token_documents",
    "load_tokenizer",
    "markdown_table",
    "needle_grid",
    "parse_rope_params",
    "passkey_accuracy",
    "pivot_table",
    "plot_heatmap",
    "plot_perplexity",
    "resolve_files",
    "requested_parameters",
    "sliding_window_baseline",
    "sliding_window_losses",
    "token_losses",
    "tokenize_pieces",
    "truncated_perplexity",
    "write_json",
]
