"""``RopeExtLM``: lm-eval's ``HFLM`` on a model that the package loads with a rope type, a factor and other rope
parameters (and a peft adapter), exactly as ``hf-rope-ext eval`` loads it.

``--model_args`` it reads besides HFLM's own: ``rope_type``, ``factor``, ``adapter``, ``dtype`` (float32 default,
bfloat16), and any parameter the rope type takes (``window=2048``, ``group_size=3``). HFLM's arguments
(``batch_size``, ``max_length``, ``add_bos_token``, ...) pass through. ``max_length``, the most tokens lm-eval feeds
the model (it left-truncates longer prompts), defaults to ``factor`` x L0 with a factor and to the saved
``max_position_embeddings`` without one; pass ``max_length=`` for a type without a factor read beyond L0.
"""

from __future__ import annotations

import inspect
import sys

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..eval import adapters, loading
from ..util.did_you_mean import did_you_mean

MODEL_NAME = "hf-rope-ext"
OWN = ("pretrained", "rope_type", "factor", "adapter", "dtype", "device", "max_length")


def hflm_arguments() -> set[str]:
    return set(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs", "pretrained", "tokenizer"}


def rope_arguments(rope_type, kwargs: dict) -> dict:
    """The model args that are rope parameters (taken out of ``kwargs``); one that is neither a rope parameter of
    ``rope_type`` nor an HFLM argument is refused, naming it."""
    hflm = hflm_arguments()
    rope_keys = set() if rope_type in loading.NONE_TYPES else set(loading.accepted_keys(rope_type))
    extra = {}
    for key in [k for k in kwargs if k not in hflm]:
        if key not in rope_keys:
            allowed = sorted(rope_keys | set(OWN))
            hint = did_you_mean(key, [*rope_keys, *OWN, *hflm])
            raise ValueError(
                f"--model_args {key}={kwargs[key]!r}: not an argument of lm-eval model {MODEL_NAME!r}{hint}; "
                f"allowed: {', '.join(allowed)} and HFLM's own arguments"
            )
        extra[key] = kwargs.pop(key)
    return extra


def dtype_of(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"--model_args dtype={name!r}: expected a floating torch dtype such as float32 or bfloat16")
    return value


def resolve_device(device) -> str:
    """The device the model runs on, as lm-eval's own ``hf`` model chooses it: the one asked for where it exists, else
    CUDA when there is one, else the CPU. lm-eval asks for ``cuda:0`` unless told otherwise, so on a machine without
    CUDA a CUDA device falls back to the CPU, with a note."""
    if device and not (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return str(device)
    if device:
        print(
            f"{MODEL_NAME}: device {device!r} asked for, but torch has no CUDA here: running on the CPU",
            file=sys.stderr,
        )
    return "cuda" if torch.cuda.is_available() else "cpu"


@register_model(MODEL_NAME)
class RopeExtLM(HFLM):
    def __init__(
        self,
        pretrained,
        rope_type=None,
        factor=None,
        adapter=None,
        dtype="float32",
        device=None,
        max_length=None,
        **kwargs,
    ):
        path, adapter = adapters.split(str(pretrained), adapter)
        folder = adapters.config_folder(path, adapter)
        config = loading.load_config(folder)
        extra = rope_arguments(rope_type, kwargs)
        factor = None if factor is None else float(factor)
        params = loading.requested_parameters(config, rope_type, factor, extra)
        device = resolve_device(device)
        model = loading.load_model(path, params, dtype=dtype_of(dtype), device=device, adapter=adapter)
        pretrain = loading.pretraining_length(config)
        length = int(max_length or (factor * pretrain if factor else config.max_position_embeddings))
        print(
            f"{MODEL_NAME}: rope_parameters {params}; lm-eval reads at most max_length={length} tokens "
            "(prompt and answer; longer prompts are cut from the left)",
            file=sys.stderr,
        )
        self.rope_parameters = params
        tokenizer = loading.load_tokenizer(adapters.tokenizer_folder(path, adapter))
        super().__init__(pretrained=model, tokenizer=tokenizer, max_length=length, device=device, **kwargs)
