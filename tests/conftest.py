"""What the test files share: tiny models from configs and the parameter tables they run with, the calls every
attention test makes on them (logits, a left-padded ``generate``), the byte-level Llamas the evaluation and
fine-tuning tests save, and the fixtures (``family``, ``docs_dir``). No test module imports another; a helper two of
them need lives here or in a helper module named for what it computes (``pair_reference``, ``cuda_twins``)."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

import hf_rope_ext  # noqa: F401  (registers the package's rope types)

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

# A suite started as a background job of a script (`pytest &`, nohup) starts with SIGINT ignored, and every run it
# starts would inherit that: a run leaves an ignored SIGINT ignored (hf_rope_ext/train/interrupt.py), so the Ctrl-C
# tests of tests/test_distributed.py would wait for a stop that never comes. Python's own handler, as in a terminal
# (a handler, unlike an ignored signal, is not inherited by the runs the tests start).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# model_type -> the config keys a tiny model of that family needs
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "stablelm": {"partial_rotary_factor": 0.5},
    "qwen3": {"head_dim": 24},
}
# rope_type -> small parameters of each attention-level type for tiny models (windows shorter than the prompts)
ATTENTION_PARAMS = {
    "dual_chunk": {"chunk_size": 6, "local_size": 2},
    "rerope": {"window": 4},
    "leaky_rerope": {"window": 4, "factor": 3.0},
    "self_extend": {"window": 4, "group_size": 3},
    "string": {"window": 4, "local_window": 1},
    "xpos": {"scale_base": 8.0},
    "roper": {"value_rotary_factor": 1.0},
}
# the same with windows of 5 over 40-token calls: the engines' tests (tests/test_attention_fast.py, _engines.py)
ENGINE_PARAMS = {
    "dual_chunk": {"chunk_size": 8, "local_size": 3},
    "rerope": {"window": 5},
    "leaky_rerope": {"window": 5, "factor": 2.5},
    "self_extend": {"window": 5, "group_size": 3},
    "string": {"window": 5, "local_window": 2},
    "xpos": {"scale_base": 8.0},
    "roper": {"value_rotary_factor": 1.0},
}
# the same and dynamic_yarn, which the engines rotate too (tests/test_attention_engines.py, _implementations.py)
ENGINE_PARAMS_WITH_DYNAMIC_YARN = {**ENGINE_PARAMS, "dynamic_yarn": {"original_max_position_embeddings": 16}}
# parameters that make every band matter in 24 tokens: the slow pair-by-pair references' tests
REFERENCE_PARAMS = {
    "dual_chunk": {"chunk_size": 7, "local_size": 2},
    "rerope": {"window": 5},
    "leaky_rerope": {"window": 5, "factor": 2.5},
    "self_extend": {"window": 5, "group_size": 3},
    "string": {"window": 5, "local_window": 2},
    "xpos": {"scale_base": 8.0, "gamma": 0.4},
    "roper": {"value_rotary_factor": 0.5},
}


def fast_plans(name: str) -> bool:
    """Whether the fast engine plans the type's declaration (else ``sdpa`` runs the reference engine)."""
    from hf_rope_ext.attention.engine import fast
    from hf_rope_ext.attention.methods.form import PLAIN
    from hf_rope_ext.types import registry

    return fast.plan_of(registry.get_method(name).attention or PLAIN) is not None


def with_rope(name: str, params: dict, **overrides) -> dict:
    """``{"rope_type": name, **params, **overrides}``, STRING's ``local_window`` kept below an overridden window."""
    rope = {"rope_type": name, **params, **overrides}
    if "local_window" in rope and "window" in overrides:
        rope["local_window"] = min(rope["local_window"], rope["window"] - 1)
    return rope


TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


# a one-layer GQA Llama for tests that save and reload many models (cards, push)
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=64,
)


def random_lora_b(model, scale: float = 0.05, seed: int | None = None):
    """``model`` with its LoRA B matrices drawn from N(0, scale) (from the global RNG, or a generator seeded with
    ``seed``) instead of peft's zeros, so that every adapter's A has a gradient and every adapter moves the output."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, scale, generator=generator)
    return model


def tiny_config(family: str = "llama", rope_parameters: dict | None = None, **overrides):
    """A 2-layer GQA config of ``family`` (4 query heads, 2 kv heads, head_dim 16 unless overridden)."""
    kwargs = {**TINY, **FAMILIES[family], **overrides}
    if rope_parameters is not None:
        kwargs["rope_parameters"] = dict(rope_parameters)
    return AutoConfig.for_model(family, **kwargs)


def tiny_model(family: str = "llama", rope_parameters: dict | None = None, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(family, rope_parameters, **overrides)
    config._attn_implementation = overrides.pop("attn_implementation", None) or "eager"
    return AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation).eval()


# a Llama over ByT5's byte-level tokenizer (384 ids: the bytes + 3, pad 0, eos 1, no bos): 2 layers, GQA
BYTE_LLAMA = dict(
    vocab_size=384,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
)
EVAL_L0 = 64  # the evaluation tests' Llama: one layer of 2 heads (head_dim 16), tied embeddings, trained length
EVAL_LLAMA = dict(
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=EVAL_L0,
    tie_word_embeddings=True,
)
PNG_MAGIC = b"\x89PNG"


def byte_llama_config(**overrides):
    return AutoConfig.for_model("llama", **{**BYTE_LLAMA, **overrides})


def eval_llama_config(**overrides):
    return byte_llama_config(**{**EVAL_LLAMA, **overrides})


def save_with_byte_tokenizer(path, config, seed: int = 0):
    """Save a random model of ``config`` (seeded) and ByT5's tokenizer to ``path``."""
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return path


def save_byte_llama(path, max_position_embeddings: int, seed: int = 0, **overrides):
    """Save a 2-layer GQA Llama with a byte-level tokenizer to ``path`` (the fine-tuning base)."""
    config = byte_llama_config(max_position_embeddings=max_position_embeddings, **overrides)
    return save_with_byte_tokenizer(path, config, seed)


def save_eval_llama(path, seed: int = 0, **overrides):
    """Save the evaluation tests' Llama (``EVAL_LLAMA``, L0 = 64 unless overridden) to ``path``."""
    return save_with_byte_tokenizer(path, eval_llama_config(**overrides), seed)


def logits(model, ids, **kwargs) -> torch.Tensor:
    """The model's logits [B, L, vocab] for ``ids`` [B, L], without gradients."""
    with torch.no_grad():
        return model(ids, **kwargs).logits


def logits_with(model, implementation: str, ids, **kwargs) -> torch.Tensor:
    """The logits under another registered attention ``implementation`` (a reference); the model's own is restored."""
    own = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        return logits(model, ids, **kwargs)
    finally:
        model.set_attn_implementation(own)


def left_padded_batch(length: int = 12, pad: int = 4):
    """(ids, attention mask) [2, length]: two prompts, the second shorter and left-padded by ``pad`` (id 0)."""
    ids = torch.randint(3, 97, (2, length), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids, mask


def generate_left_padded(model, use_cache: bool, length: int = 12, pad: int = 4, new_tokens: int = 8):
    """Greedy ``generate`` on ``left_padded_batch(length, pad)``: (sequences [2, length + new_tokens], the logits of
    every step [2, new_tokens, vocab])."""
    ids, mask = left_padded_batch(length, pad)
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        use_cache=use_cache,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return out.sequences, torch.stack(out.logits, 1)


def error_text(excinfo) -> str:
    """The message the user reads; an error transformers' strict configs wrap must wrap a ValueError or KeyError."""
    err = excinfo.value
    if isinstance(err, StrictDataclassError):  # transformers' configs wrap a validator's ValueError
        assert isinstance(err.__cause__, (ValueError, KeyError))
    return f"{err} {err.__cause__ or ''}"


def _legacy_kwarg_is_standardized() -> bool:
    """Whether this transformers turns ``from_pretrained(path, rope_scaling={"type": ...})`` into ``rope_type``.

    transformers 5.17 sets such a kwarg on the config as it is, so its own rotary modules fail on the missing
    ``rope_type`` before any rope function runs; newer 5.x releases standardize it.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tiny_config("llama").save_pretrained(folder)
        legacy = {"type": "linear", "factor": 2.0, "rope_theta": 10000.0}
        return "rope_type" in AutoConfig.from_pretrained(folder, rope_scaling=legacy).rope_parameters


LEGACY_KWARG_STANDARDIZED = _legacy_kwarg_is_standardized()
needs_legacy_kwarg = pytest.mark.skipif(
    not LEGACY_KWARG_STANDARDIZED, reason="this transformers leaves a from_pretrained rope_scaling kwarg unstandardized"
)


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def probe_llama(tmp_path_factory):
    """The evaluation tests' Llama (L0 = 64) saved with its byte-level tokenizer, for the pass-key probes."""
    return save_eval_llama(tmp_path_factory.mktemp("probe_llama"), seed=3)


@pytest.fixture(scope="module")
def probe_tokenizer(probe_llama):
    from hf_rope_ext.eval.loading import load_tokenizer

    return load_tokenizer(probe_llama)


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    """Four text documents of 40, 150, 260 and 400 bytes (deterministic pseudo-code)."""
    folder = tmp_path_factory.mktemp("docs")
    words = [f"x{i % 7} = f(y{i % 5}) + {i}\n" for i in range(200)]
    for n, size in enumerate((40, 150, 260, 400)):
        (folder / f"doc{n}.txt").write_text("".join(words[n:])[:size])
    return folder


def load_script(name: str):
    """The module of ``experiments/<name>.py`` (the scripts that reproduce results; not a package), loaded afresh."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    if str(path.parent) not in sys.path:  # the scripts import one another, as when run from their folder
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
