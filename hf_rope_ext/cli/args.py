"""Argument types and options shared by the subcommands, so that one value is checked, and refused, alike everywhere.

A bad value stops the command in argparse, before anything is loaded: ``hf-rope-ext eval: error: argument
--documents: expected an integer >= 1, got '0'`` (exit status 2), naming the flag, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, "an integer >= 1", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def length(text: str) -> int:
    return _number(text, int, "a length in tokens, an integer >= 2", lambda v: v >= 2)


def factor(text: str) -> float:
    """A context-extension factor s: s x L0 tokens, so s >= 1 (1: the pretrained length)."""
    return _number(text, float, "a scaling factor >= 1", lambda v: v >= 1)


def positive_float(text: str) -> float:
    return _number(text, float, "a number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    return _number(text, float, "a number >= 0", lambda v: v >= 0)


def probability(text: str) -> float:
    return _number(text, float, "a number >= 0 and < 1", lambda v: 0 <= v < 1)


def comma_list(item_type):
    """'a,b,c' -> [item_type(a), ...]; at least one item."""

    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        try:
            return [item_type(x) for x in items]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} in the comma-separated list {text!r}") from None

    parse.__name__ = f"list of {item_type.__name__}"
    return parse


def names(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'), each name as written (a name the model lacks is refused later, listing the ones it has)."""
    return tuple(text.split(","))


def rope_param(text: str) -> str:
    """KEY=VALUE (the value is read as JSON later, by ``hf_rope_ext.eval.loading.parse_rope_params``)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def add_rope_arguments(
    parser, factor_help: str = "scaling factor s of the rope type (>= 1)", rope_type_required: bool = False
) -> None:
    """--rope-type, --factor, --rope-param (eval, extend, finetune)."""
    what = "rope type to train with" if rope_type_required else "rope type to apply (default: the model as saved)"
    parser.add_argument(
        "--rope-type", required=rope_type_required, default=None, help=f"{what}; see `hf-rope-ext list`"
    )
    parser.add_argument("--factor", type=factor, default=None, help=factor_help)
    parser.add_argument(
        "--rope-param",
        type=rope_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another rope parameter, VALUE read as JSON (repeatable), e.g. --rope-param beta_fast=16",
    )


def progress_argument(parser) -> None:
    """--no-progress, for every command that runs loops (``hf_rope_ext.util.progress``)."""
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress output at all (default: bars on a terminal, else a plain line every 15 s)",
    )


def model_argument(parser, hub: bool = False) -> None:
    where = "model folder or Hub repo id" if hub else "model folder (with config.json)"
    parser.add_argument("--model", default=None, help=f"{where}; default: the bundled tiny-llama-stdlib")
