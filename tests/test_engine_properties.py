"""Property tests: the fast engine (``sdpa``) against the reference engine (``eager``) on random cases, with
hypothesis. A case draws a type (every type the engines rotate, from the registry) and its parameters (windows,
factors, groups, chunks, ramps, the attention temperature), a model shape (batch, GQA ratio, head size, partial
rotary), a sequence cut into calls on a growing cache (a prefill in pieces, then decode steps), left padding,
shifted positions, a cache kind (a rotating dynamic or static layer that keeps rotated rows, or a plain cache whose
rows the engine compares), the kernel (the CPU one, or a CPU twin of the CUDA one with whole bands, with or without
torch's fused ops first: ``cuda_twins``), the path (eager, or the path a torch.compile trace takes, run uncompiled)
and the dtype (float32; bfloat16 against the float32 reference on the same rounded inputs, within eight bfloat16
steps of the largest output: the reference engine in bfloat16, where the fast one does not apply, rounds each
score). Each call's real rows must match.

CI runs a small fixed budget (profile ``ci``: 150 examples, derandomized, no deadline; about 15 s). By hand, a longer
search:

    HYPOTHESIS_PROFILE=long PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/test_engine_properties.py

(``long``: 2000 examples per test; ``HYPOTHESIS_SEED=n`` picks another random start.)
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from conftest import ENGINE_PARAMS_WITH_DYNAMIC_YARN, tiny_model
from cuda_twins import block_list_kernel, dense_kernel, fused_kernel

from hf_rope_ext._transformers import cache_layers
from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import dense_ops, kernels
from hf_rope_ext.types import registry

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

settings.register_profile(
    "ci", max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

L0 = 64  # the tiny models' max_position_embeddings: windows and chunks below it
TYPES = sorted({m.name for m in registry.methods() if m.kind == "attention"} | set(ENGINE_PARAMS_WITH_DYNAMIC_YARN))
TWINS = {  # the fused twins: the CUDA kernel's code with each of torch's fused ops as sdpa's choice
    "dense": dense_kernel,
    "blocks": block_list_kernel,
    **{f"fused-{b.name.lower()}": fused_kernel(b) for b in dense_ops.OPS},
}


@st.composite
def windowed(draw, extra=None):
    window = draw(st.integers(1, 12))
    return {"window": window, **(draw(extra(window)) if extra else {})}


PARAMS = {  # type -> strategy of its own parameters (a type not listed here runs with its declared example)
    "rerope": windowed(),
    "leaky_rerope": windowed(lambda w: st.fixed_dictionaries({"factor": st.floats(1.0, 4.0)})),
    "self_extend": windowed(lambda w: st.fixed_dictionaries({"group_size": st.integers(1, 5)})),
    "string": st.integers(2, 12).flatmap(
        lambda w: st.fixed_dictionaries(
            {"window": st.just(w), "local_window": st.integers(0, w - 1), "ramp": st.integers(0, 8)}
        )
    ),
    "xpos": st.fixed_dictionaries({"scale_base": st.floats(4.0, 64.0), "gamma": st.floats(0.2, 0.8)}),
    "roper": st.fixed_dictionaries({"value_rotary_factor": st.sampled_from([0.5, 1.0])}),
    "dual_chunk": st.integers(3, 16).flatmap(
        lambda size: st.fixed_dictionaries({"chunk_size": st.just(size), "local_size": st.integers(0, size - 1)})
    ),
    "dynamic_yarn": st.fixed_dictionaries({"original_max_position_embeddings": st.integers(8, 32)}),
}
TEMPERATURE = st.sampled_from(
    [{}, {"attention_temperature": "log"}, {"attention_temperature": "constant", "temperature_factor": 2.0}]
)


@dataclass
class Case:
    name: str
    rope: dict
    batch: int
    kv_heads: int
    groups: int
    head_dim: int
    partial: float
    length: int
    cuts: list[int]  # call boundaries: calls [cuts[i], cuts[i + 1])
    pads: list[int]  # left padding per batch row
    shift: int  # added to every position
    cache: str  # "dynamic", "static" (rotating layers) or "plain"
    kernel: str  # "cpu" or a CUDA twin
    traced: bool  # the path a torch.compile trace takes
    dtype: torch.dtype
    seed: int


@st.composite
def cases(draw) -> Case:
    name = draw(st.sampled_from(TYPES))
    method = registry.get_method(name)
    strategy = PARAMS.get(name, st.just(dict(method.example or {})))
    rope = {"rope_type": name, **draw(strategy)}
    if method.kind == "attention":
        rope.update(draw(TEMPERATURE))
    length = draw(st.integers(1, 40))
    inner = draw(st.lists(st.integers(1, length - 1), max_size=4, unique=True)) if length > 1 else []
    decode = draw(st.integers(0, 4))  # decode steps after the prefill pieces
    cuts = [0, *sorted(inner), length] + [length + i for i in range(1, decode + 1)]
    batch, padded = draw(st.integers(1, 2)), draw(st.booleans())  # without padding: the unmasked plans
    pads = [draw(st.integers(0, min(6, length - 1))) if padded else 0 for _ in range(batch)]
    return Case(
        name=name,
        rope=rope,
        batch=batch,
        kv_heads=draw(st.integers(1, 2)),
        groups=draw(st.integers(1, 3)),
        head_dim=draw(st.sampled_from([8, 12, 16])),
        partial=draw(st.sampled_from([1.0, 0.5])),
        length=cuts[-1],
        cuts=cuts,
        pads=pads,
        shift=draw(st.sampled_from([0, 0, 1, 7, 20])),
        cache=draw(st.sampled_from(["dynamic", "static", "plain"])),
        kernel=draw(st.sampled_from(["cpu", *TWINS])),
        traced=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
    )


def module_of(case: Case):
    rope = {**case.rope, "partial_rotary_factor": case.partial}
    heads = case.kv_heads * case.groups
    model = tiny_model(
        "llama", rope, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=case.kv_heads,
        head_dim=case.head_dim, hidden_size=16 * heads, max_position_embeddings=L0,
    )  # fmt: skip
    return model.model.layers[0].self_attn


def positions_and_keep(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, T] as generate gives them, shifted; keep [B, T] bool: not padding)."""
    keep = torch.arange(case.length)[None] >= torch.tensor(case.pads)[:, None]
    positions = (keep.long().cumsum(-1) - 1).masked_fill(~keep, 1) + case.shift
    return positions, keep


def call_mask(case: Case, keep: torch.Tensor, start: int, stop: int, slots: int) -> torch.Tensor | None:
    """What transformers hands sdpa for queries [start, stop) over keys [0, stop) (and ``slots`` unfilled static
    slots): None when causal alone says it, else [B, 1, q, kv] bool."""
    if not slots and bool(keep.all()):
        return None
    rows = torch.arange(start, stop)[:, None]
    columns = torch.arange(stop + slots)[None]
    allowed = (columns <= rows) & torch.nn.functional.pad(keep[:, :stop], (0, slots))[:, None, :]
    return allowed[:, None]


def run_case(case: Case) -> None:
    module = module_of(case)
    g = torch.Generator().manual_seed(case.seed)
    heads, d = case.kv_heads * case.groups, case.head_dim
    q = torch.randn(case.batch, heads, case.length, d, generator=g).to(case.dtype)
    k, v = (torch.randn(case.batch, case.kv_heads, case.length, d, generator=g).to(case.dtype) for _ in range(2))
    positions, keep = positions_and_keep(case)
    layer = {"dynamic": cache_layers.RotatingDynamicLayer, "static": cache_layers.RotatingStaticLayer}.get(case.cache)
    layer = layer(max_cache_len=case.length) if case.cache == "static" else layer() if layer else None
    for start, stop in zip(case.cuts, case.cuts[1:], strict=False):
        if layer is not None:
            keys, values = layer.update(k[:, :, start:stop], v[:, :, start:stop])
        else:
            keys, values = k[:, :, :stop].clone(), v[:, :, :stop].clone()
        slots = keys.shape[2] - stop
        mask = call_mask(case, keep, start, stop, slots)
        args = (q[:, :, start:stop], keys, values, mask)
        with ExitStack() as stack:
            if case.kernel != "cpu":
                stack.enter_context(mock.patch.dict(kernels.KERNELS, cpu=TWINS[case.kernel]))
                stack.enter_context(mock.patch.object(kernels, "WHOLE_BANDS", {"cpu", "cuda"}))
            if case.traced:
                stack.enter_context(mock.patch.object(torch.compiler, "is_compiling", lambda: True))
            got = function.attend("sdpa", module, *args, position_ids=positions[:, start:stop])[0]
        wide = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        expected = function.attend("eager", module, *wide, position_ids=positions[:, start:stop])[0]
        real = keep[:, start:stop]  # [B, q]: rows of real tokens (a padding row sees no key)
        got, expected = got[real].float(), expected[real]
        if case.dtype == torch.float32:
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
        elif expected.numel():  # bfloat16: eight steps of the largest output (float32 catches the subtle errors)
            assert (got - expected).abs().max() <= 8 * 2**-8 * max(1.0, float(expected.abs().max()))


FULL_STATIC_CACHE = Case(  # a static cache filled to its end by two queries, no mask: read as an empty cache's prompt
    name="leaky_rerope", rope={"rope_type": "leaky_rerope", "window": 1, "factor": 1.0}, batch=1, kv_heads=1,
    groups=1, head_dim=8, partial=1.0, length=3, cuts=[0, 1, 3], pads=[0], shift=0, cache="static", kernel="cpu",
    traced=False, dtype=torch.float32, seed=0,
)  # fmt: skip


@settings(PROFILE)
@given(case=cases())
@example(case=FULL_STATIC_CACHE)
def test_the_fast_engine_equals_the_reference_on_random_cases(case):
    run_case(case)


@settings(PROFILE)
@given(gamma=st.floats(0.01, 10.0), scale_base=st.floats(1.0, 4096.0))
def test_a_declared_steepest_decay_is_its_first_pairs(gamma, scale_base):
    """``Decay.steepest`` (what chunks are sized by, a number torch.compile can take) is -log zeta_0 of ``log_zeta``,
    and the largest decay of every pair, for each type that declares a decay."""
    for method in registry.methods():
        decay = method.attention.decay if method.attention is not None else None
        if decay is None or decay.steepest is None:
            continue
        params = registry.filled({"rope_type": method.name, "gamma": gamma, "scale_base": scale_base}, method)
        logs = decay.log_zeta(torch.arange(8, dtype=torch.float64) / 8, params)
        assert decay.steepest(params) == pytest.approx(-float(logs[0]), rel=1e-12)
        assert decay.steepest(params) >= float(-logs.min()) - 1e-12
