"""Every attention-level type under torch.compile with ``fullgraph=True`` (no graph break) gives the tokens of the
uncompiled model: transformers' own compiled decode (``generate(cache_implementation="static")``, which compiles
the decode step by itself on a GPU and here through ``CompileConfig._compile_all_devices``), and a forward compiled
with dynamic shapes over a DynamicCache. Static shapes under a StaticCache: no recompilation over a run whose cache
passes the 128-key blocks of the CUDA kernel. The types come from the registry, so a new one is tested too."""

from __future__ import annotations

import pytest
import torch
from conftest import ATTENTION_PARAMS, left_padded_batch, tiny_model, with_rope
from transformers import CompileConfig

from hf_rope_ext.types import registry

TYPES = sorted(m.name for m in registry.methods() if m.kind == "attention")
LONG_RUN = 300  # new tokens after a 12-token prompt: past two 128-key block boundaries of flex_attention's blocks


def model_of(name: str, family: str = "llama"):
    params = ATTENTION_PARAMS.get(name, registry.get_method(name).example)
    return tiny_model(family, with_rope(name, params), attn_implementation="sdpa")


def compile_config(backend: str) -> CompileConfig:
    config = CompileConfig(fullgraph=True, backend=backend)
    config._compile_all_devices = True  # transformers compiles the decode step on CPU too (its tests' switch)
    return config


def generate_static(model, ids, new_tokens: int, compiled: CompileConfig | None = None, **kwargs) -> torch.Tensor:
    """Greedy tokens with a StaticCache; compiled by transformers when given a config, else not."""
    switch = {"compile_config": compiled} if compiled is not None else {"disable_compile": True}
    options = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        return model.generate(ids, **options, **switch, **kwargs)


@pytest.mark.parametrize("name", TYPES)
def test_compiled_static_decode_gives_the_uncompiled_tokens_without_recompiling(name):
    """aot_eager (dynamo and AOT autograd's functional graph, as inductor receives it), fullgraph, 300 steps."""
    torch._dynamo.reset()
    model = model_of(name)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    expected = generate_static(model, ids, LONG_RUN)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = generate_static(model, ids, LONG_RUN, compile_config("aot_eager"))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", TYPES)
def test_compiled_static_decode_of_a_left_padded_batch_on_qwen2(name):
    """The padding reaches the compiled step only through the mask, on the device."""
    torch._dynamo.reset()
    model = model_of(name, "qwen2")
    ids, mask = left_padded_batch()
    expected = generate_static(model, ids, 12, attention_mask=mask)
    assert torch.equal(generate_static(model, ids, 12, compile_config("eager"), attention_mask=mask), expected)


@pytest.mark.parametrize("name", TYPES)
def test_a_forward_compiled_with_dynamic_shapes_generates_the_uncompiled_tokens_on_mistral(name):
    """A DynamicCache grows every step: one graph for prompts, one for single tokens, kept for a second prompt of
    another length (dynamic shapes: no recompilation). One layer: tracing with symbolic shapes takes its time."""
    torch._dynamo.reset()
    params = ATTENTION_PARAMS.get(name, registry.get_method(name).example)
    model = tiny_model("mistral", with_rope(name, params), attn_implementation="sdpa", num_hidden_layers=1)
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    prompts = [torch.randint(3, 97, (2, n), generator=torch.Generator().manual_seed(n)) for n in (11, 13)]
    with torch.no_grad():
        expected = [model.generate(ids, **options) for ids in prompts]
        model.forward = torch.compile(model.forward, fullgraph=True, backend="eager", dynamic=True)
        first = model.generate(prompts[0], **options)
        with torch._dynamo.config.patch(error_on_recompile=True):
            second = model.generate(prompts[1], **options)
    assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])


def test_inductor_compiles_a_two_band_decode_to_the_uncompiled_tokens():
    """The real compiler once (self_extend: both bands, grouped positions), fullgraph, static shapes; one layer (its
    compile time is most of the test's)."""
    torch._dynamo.reset()
    params = ATTENTION_PARAMS["self_extend"]
    model = tiny_model("llama", with_rope("self_extend", params), attn_implementation="sdpa", num_hidden_layers=1)
    ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(4))
    expected = generate_static(model, ids, 24)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(generate_static(model, ids, 24, compile_config("inductor")), expected)


def test_a_dynamic_frequency_type_breaks_the_graph_only_in_transformers_rotary_module():
    """dynamic_yarn's frequencies follow the length; the attention function takes it on the device
    (``traced_frequencies``), so under transformers' default compile config (``fullgraph=False``) the one graph
    break of a step is transformers' own dynamic updater in the rotary module (a branch on the length, for every
    type named "dynamic"), not a read-back in every layer; the tokens are the uncompiled ones, past L0 = 16."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    params = {"original_max_position_embeddings": 16}
    model = tiny_model("llama", with_rope("dynamic_yarn", params), attn_implementation="sdpa", num_hidden_layers=3)
    ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(6))
    expected = generate_static(model, ids, 12)
    config = compile_config("eager")
    config.fullgraph = False  # transformers' default
    assert torch.equal(generate_static(model, ids, 12, config), expected)
    breaks = list(torch._dynamo.utils.counters["graph_break"])
    assert breaks and all("dynamic_frequency_update" in reason for reason in breaks), breaks
