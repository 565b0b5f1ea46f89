"""``train.memory.input_casting`` and ``train.memory.lean_norm``: a bf16 LoRA step (bf16 frozen weights, fp32 LoRA
weights, bf16 autocast) without peft's cast of the adapters' inputs and with lean RMSNorms gives the stock step's loss
and gradients bit for bit (each change alone and both, norms trained or not, activation checkpointing on and off, the
norms' chunks of tokens engaged or not); the lean function equals ``LlamaRMSNorm`` bit for bit on random shapes (fp32,
bf16, fp16), on rows of several chunks with an uneven last one, and keeps the half input, not an fp32 copy; its
temporaries are one chunk's, whatever the row (``LivePeak``), and writing the chunks into one tensor holds less than
joining them; the live bytes held after the forward drop by exactly what the two changes spare, and the peak with
them; the disable functions put everything back; a norm of another formula is left alone."""

from __future__ import annotations

import pytest
import torch
from conftest import random_lora_b
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory import input_casting, lean_norm, norm_chunks
from hf_rope_ext.train.memory.input_casting import keep_adapter_input_dtype
from hf_rope_ext.train.memory.lean_norm import LeanRMSNorm, enable_lean_norms, lean_rms_norm
from hf_rope_ext.util.memory_peak import LivePeak
from hf_rope_ext.util.quiet import enable_activation_checkpointing

HIDDEN, LAYERS, VOCAB = 64, 2, 512
ROWS, SEQ = 2, 32
CONFIG = dict(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4)
CONFIG.update(num_key_value_heads=2, vocab_size=VOCAB)
CHANGES = {"casting": (True, False), "norms": (False, True), "both": (True, True)}  # (keep input dtype, lean norms)
STEP_CHUNK = 48  # tokens per norm chunk in the step's "chunked" runs: ROWS * SEQ = 64 tokens run as 48 + 16


def bf16_lora_model(train_norms=False, checkpointing=False):
    """A seeded tiny Llama in bf16 with fp32 LoRA (B random, so every adapter has a gradient), in training mode."""
    torch.manual_seed(0)
    model = apply_lora(LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16), rank=8, train_norms=train_norms)
    random_lora_b(model)
    if checkpointing:
        enable_activation_checkpointing(model, use_reentrant=False)
    return model.train()


def batch() -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))


def forward(model, ids) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=ids, labels=ids).loss


def step(model, ids):
    """(loss, {name: gradient} of every trainable parameter) of one step."""
    model.zero_grad(set_to_none=True)
    loss = forward(model, ids)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_bitwise(reference, other) -> None:
    (loss_a, grads_a), (loss_b, grads_b) = reference, other
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, grad in grads_a.items():
        assert grad.dtype == grads_b[name].dtype and torch.equal(grad, grads_b[name]), name


def force_chunk(monkeypatch, tokens: int, hidden: int) -> None:
    """A budget (``norm_chunks.CHUNK_BYTES``) that makes a norm of size ``hidden`` run chunks of ``tokens`` tokens."""
    monkeypatch.setattr(norm_chunks, "CHUNK_BYTES", tokens * hidden * norm_chunks.FP32 * norm_chunks.CHUNK_FP32)
    assert norm_chunks.chunk_tokens(hidden) == tokens


def apply_changes(model, change: str):
    """Turns on the changes named (every norm lean: the probe turned none away); returns the function undoing them."""
    keep, lean = CHANGES[change]
    undo = [keep_adapter_input_dtype(model)] if keep else []
    if lean:
        disable, names = enable_lean_norms(model)
        assert names == [name for name, m in model.named_modules() if isinstance(m, LlamaRMSNorm)]  # all of them
        undo.append(disable)
    return lambda: [off() for off in undo]


# --- the step, bit for bit ---


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("train_norms", [False, True], ids=["frozen_norms", "train_norms"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_step_bitwise_equal(change, train_norms, checkpointing, chunked, monkeypatch):
    if chunked:
        force_chunk(monkeypatch, STEP_CHUNK, HIDDEN)
    assert norm_chunks.chunk_sizes(ROWS * SEQ, HIDDEN) == ([48, 16] if chunked else [ROWS * SEQ])
    model, ids = bf16_lora_model(train_norms, checkpointing), batch()
    stock = step(model, ids)
    if train_norms:
        assert sum("norm" in name for name in stock[1]) == 2 * LAYERS + 1
    off = apply_changes(model, change)
    assert_bitwise(stock, step(model, ids))
    off()
    assert_bitwise(stock, step(model, ids))


# --- the function against LlamaRMSNorm ---


def norm_and_grads(fn, x, weight, grad):
    """fn(x, weight) and the gradients of x and (where it requires grad) weight for the output gradient ``grad``."""
    x = x.detach().requires_grad_()
    out = fn(x, weight)
    inputs = (x, weight) if weight.requires_grad else (x,)
    return [out, *torch.autograd.grad(out, inputs, grad)]


def random_case(generator, dtype, weight_dtype, train_weight):
    """A norm of random size and weight, an input of random shape (0 to 2 leading dims) and an output gradient."""
    size = int(torch.randint(1, 300, (), generator=generator))
    lead = torch.randint(1, 5, (int(torch.randint(0, 3, (), generator=generator)),), generator=generator).tolist()
    norm = LlamaRMSNorm(size, eps=1e-6).to(weight_dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(size, generator=generator) * 2)
    norm.weight.requires_grad_(train_weight)
    x = (torch.randn((*lead, size), generator=generator) * 4).to(dtype)
    out_dtype = torch.promote_types(dtype, weight_dtype)
    return norm, x, torch.randn(x.shape, generator=generator).to(out_dtype)


def assert_case_bitwise(norm, x, grad) -> None:
    """The module and :func:`lean_rms_norm`: output, input gradient and weight gradient equal in dtype and bits."""
    stock = norm_and_grads(lambda a, w: norm(a), x, norm.weight, grad)
    lean = norm_and_grads(lambda a, w: lean_rms_norm(a, w, norm.variance_epsilon), x, norm.weight, grad)
    for a, b in zip(stock, lean, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), (x.shape, x.dtype, norm.weight.dtype)


@pytest.mark.parametrize("train_weight", [True, False], ids=["trained", "frozen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_function_bitwise_equal_to_llama_rmsnorm(dtype, train_weight):
    generator = torch.Generator().manual_seed(2)
    for weight_dtype in dict.fromkeys((dtype, torch.float32)):
        for _ in range(12):
            assert_case_bitwise(*random_case(generator, dtype, weight_dtype, train_weight))


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_function_bitwise_on_a_strided_input(chunked, monkeypatch):
    """A transposed input has no (tokens, D) view: it runs as one chunk; a slice of a wider tensor (rows apart in
    memory) has one, and runs in chunks."""
    if chunked:
        force_chunk(monkeypatch, 16, 40)
    transposed = torch.randn(20, 3, 40).to(torch.bfloat16).transpose(0, 1)  # (3, 20, 40), not contiguous
    sliced = torch.randn(3, 20, 64).to(torch.bfloat16)[..., :40]  # (3, 20, 40), 64 elements a row apart
    norm, grad = LlamaRMSNorm(40), torch.randn(3, 20, 40).to(torch.bfloat16)
    for x in (transposed, sliced):
        stock = norm_and_grads(lambda a, w: norm(a), x, norm.weight, grad)
        lean = norm_and_grads(lambda a, w: LeanRMSNorm.apply(a, w, norm.variance_epsilon), x, norm.weight, grad)
        assert all(torch.equal(a, b) for a, b in zip(stock, lean, strict=True))


# a row of several chunks: (input shape, tokens per chunk); the last chunk uneven, or a short last piece joined to
# the chunk before it (under norm_chunks.MIN_CHUNK tokens)
CHUNKED = {
    "3d_uneven_last": ((3, 29, 40), 32),  # 87 tokens: 32, 32, 23
    "3d_joined_last": ((2, 41, 24), 16),  # 82 tokens: 16, 16, 16, 16, 18
    "2d": ((70, 56), 16),  # 70 tokens: 16, 16, 16, 22
    "4d": ((2, 3, 7, 48), 16),  # 42 tokens: 16, 26
}
DTYPES = {"bf16": (torch.bfloat16,) * 2, "bf16_fp32_weight": (torch.bfloat16, torch.float32)}
DTYPES |= {"fp16": (torch.float16,) * 2, "fp16_fp32_weight": (torch.float16, torch.float32)}


def chunks_run(monkeypatch) -> dict[str, list[int]]:
    """The tokens of each chunk the lean forward and input gradient run, recorded as they run."""
    runs = {"forward": [], "input_grad": []}
    for name, fn in (("forward", lean_norm._forward_chunk), ("input_grad", lean_norm._input_grad_chunk)):

        def counted(x, *args, _fn=fn, _name=name, **kwargs):
            runs[_name].append(x.shape[0])
            return _fn(x, *args, **kwargs)

        monkeypatch.setattr(lean_norm, f"_{name}_chunk", counted)
    return runs


@pytest.mark.parametrize("train_weight", [True, False], ids=["trained", "frozen"])
@pytest.mark.parametrize("dtypes", list(DTYPES))
@pytest.mark.parametrize("case", list(CHUNKED))
def test_chunked_function_bitwise_equal_to_llama_rmsnorm(case, dtypes, train_weight, monkeypatch):
    (shape, chunk), (dtype, weight_dtype) = CHUNKED[case], DTYPES[dtypes]
    force_chunk(monkeypatch, chunk, shape[-1])
    tokens = torch.Size(shape[:-1]).numel()
    sizes = norm_chunks.chunk_sizes(tokens, shape[-1])
    assert len(sizes) > 1 and sizes[-1] != chunk and sum(sizes) == tokens
    runs, generator = chunks_run(monkeypatch), torch.Generator().manual_seed(3)
    norm = LlamaRMSNorm(shape[-1], eps=1e-6).to(weight_dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=generator) * 2)
    norm.weight.requires_grad_(train_weight)
    x = (torch.randn(shape, generator=generator) * 4).to(dtype)
    grad = torch.randn(shape, generator=generator).to(torch.promote_types(dtype, weight_dtype))
    assert_case_bitwise(norm, x, grad)
    assert runs == {"forward": sizes, "input_grad": sizes}


def test_the_chunk_rule():
    """The most tokens whose three fp32 temporaries fit the budget, in multiples of 16 (at least 16); chunks cover
    the row in order, a last piece under 16 joined to the chunk before it."""
    assert norm_chunks.CHUNK_BYTES == 256 * 2**20 and norm_chunks.CHUNK_FP32 == 3
    assert norm_chunks.chunk_tokens(4096) == 5456 and norm_chunks.chunk_tokens(8192) == 2720
    for hidden in (1, 64, 4096, 8192, 16384, 2**21, 2**24):
        chunk = norm_chunks.chunk_tokens(hidden)
        assert chunk % norm_chunks.MIN_CHUNK == 0 and chunk >= norm_chunks.MIN_CHUNK
        fits = chunk * hidden * 4 * 3 <= norm_chunks.CHUNK_BYTES
        assert fits or chunk == norm_chunks.MIN_CHUNK
        assert (chunk + 16) * hidden * 4 * 3 > norm_chunks.CHUNK_BYTES
    assert norm_chunks.chunk_sizes(0, 4096) == [] and norm_chunks.chunk_sizes(5, 4096) == [5]
    assert norm_chunks.chunk_sizes(5456 + 15, 4096) == [5456 + 15]
    assert norm_chunks.chunk_sizes(2 * 5456 + 16, 4096) == [5456, 5456, 16]
    assert norm_chunks.largest_chunk(524288, 4096) == 5456 and norm_chunks.largest_chunk(100, 4096) == 100
    assert norm_chunks.chunk_peak_bytes(524288, 4096) == 5456 * (3 * 4096 + 1) * 4


def saved_by(fn, x, weight) -> list[torch.Tensor]:
    """The tensors autograd keeps for the backward of fn(x, weight)."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        fn(x.requires_grad_(), weight)
    return kept


def test_function_keeps_the_half_input_not_an_fp32_copy():
    x, norm = torch.randn(2, 7, 48).to(torch.bfloat16), LlamaRMSNorm(48).to(torch.bfloat16)
    kept = saved_by(lambda a, w: lean_rms_norm(a, w, 1e-6), x, norm.weight)
    assert [t.shape for t in kept] == [x.shape, (2, 7, 1), (48,)]
    assert kept[0].data_ptr() == x.data_ptr() and kept[0].dtype == torch.bfloat16  # x itself
    assert kept[1].dtype == torch.float32 and kept[2] is norm.weight
    stock = saved_by(lambda a, w: norm(a), x.detach(), norm.weight)
    assert any(t.dtype == torch.float32 and t.shape == x.shape for t in stock)  # what the lean one spares


def test_fp32_input_runs_the_stock_ops():
    x, norm = torch.randn(3, 16, requires_grad=True), LlamaRMSNorm(16)
    assert type(lean_rms_norm(x, norm.weight, 1e-6).grad_fn).__name__ == "MulBackward0"
    assert type(lean_rms_norm(x.bfloat16(), norm.weight, 1e-6).grad_fn).__name__ == "LeanRMSNormBackward"


# --- the memory ---


def lean_peaks(x, weight, grad) -> tuple[int, int]:
    """(live peak of the lean forward, live peak of its backward): what each makes, the tensors made before it (x,
    the weight, the output gradient, the saved tensors) not counted."""
    x = x.detach().requires_grad_()
    with LivePeak() as forward:
        out = lean_rms_norm(x, weight, 1e-6)
    with LivePeak() as backward:
        torch.autograd.grad(out, (x, weight) if weight.requires_grad else (x,), grad)
    return forward.peak, backward.peak


LONG = (2, 2048, 256)  # 4096 tokens: 64 chunks of 64


@pytest.mark.parametrize("train_weight", [False, True], ids=["frozen", "trained"])
def test_the_temporaries_are_one_chunks(train_weight, monkeypatch):
    """The backward holds the input gradient it fills (a half-precision row) and one chunk's temporaries, three fp32
    (chunk, D) and the gradient of r (``chunk_peak_bytes``), exactly; with the weight trained its gradient too (its
    factor and product, a row and a chunk's two fp32, are freed before the input gradient is made). The forward holds
    its output, r and less than one chunk's. One chunk of the whole row holds 64 times the chunked temporaries."""
    generator = torch.Generator().manual_seed(4)
    x = (torch.randn(LONG, generator=generator) * 3).to(torch.bfloat16)
    grad = torch.randn(LONG, generator=generator).to(torch.bfloat16)
    weight = torch.randn(LONG[-1], generator=generator).to(torch.bfloat16).requires_grad_(train_weight)
    tokens, hidden = LONG[0] * LONG[1], LONG[-1]
    row, r, weight_grad = tokens * hidden * 2, tokens * 4, hidden * 2 * train_weight
    peaks = {}
    for chunk in (64, tokens):
        force_chunk(monkeypatch, chunk, hidden)
        temporaries = norm_chunks.chunk_peak_bytes(tokens, hidden)
        assert temporaries == chunk * (3 * hidden + 1) * 4
        forward, backward = peaks[chunk] = lean_peaks(x, weight, grad)
        assert backward == row + temporaries + weight_grad, (chunk, backward)
        assert row + r < forward <= row + r + temporaries, (chunk, forward)
    assert norm_chunks.chunk_peak_bytes(tokens, hidden) <= norm_chunks.CHUNK_BYTES + tokens * 4
    assert peaks[tokens][1] - row - weight_grad == 64 * (peaks[64][1] - row - weight_grad)


def test_writing_chunks_into_one_tensor_holds_less_than_joining_them(monkeypatch):
    """``torch.cat`` of the chunks' half results holds them all beside the joined copy: two half rows; writing each
    chunk into the input gradient, one half row and a chunk's temporaries."""
    force_chunk(monkeypatch, 64, LONG[-1])
    generator = torch.Generator().manual_seed(4)
    x = (torch.randn(LONG, generator=generator) * 3).to(torch.bfloat16)
    grad = torch.randn(LONG, generator=generator).to(torch.bfloat16)
    weight = torch.randn(LONG[-1], generator=generator).to(torch.bfloat16)
    r = lean_norm._forward(x, weight, 1e-6)[0]
    rows = [t.view(-1, t.shape[-1]) for t in (grad, x, r)]
    with LivePeak() as joined:
        parts = [
            lean_norm._input_grad_chunk(*(t[part] for t in rows), weight).to(x.dtype)
            for part in norm_chunks._chunks(rows[0].shape[0], LONG[-1])
        ]
        by_cat = torch.cat(parts).view(x.shape)
        del parts
    with LivePeak() as written:
        by_writing = lean_norm._input_grad(grad, x, r, weight)
    assert torch.equal(by_cat, by_writing)
    row = x.numel() * 2
    assert joined.peak == 2 * row
    assert written.peak == row + norm_chunks.chunk_peak_bytes(x.shape[:-1].numel(), LONG[-1])


def held_and_peak(model, ids) -> tuple[int, int]:
    """(bytes live after the forward: what it keeps for the backward, and the loss; the step's live peak)."""
    model.zero_grad(set_to_none=True)
    with LivePeak() as live:
        loss = forward(model, ids)
        held = live.live
        loss.backward()
    return held, live.peak


def spared_bytes(change: str, train_norms: bool) -> int:
    """What the changes spare in this model (N elements in a (rows, seq, hidden) activation, 2 bytes in bf16):
    - input casting, per layer: q, k and v each kept a bf16 copy (autocast's, of peft's fp32 copy: that one dies at
      once) of the norm's output, now kept once; o_proj a copy of the attention output, which SDPA keeps anyway;
    - lean norms: each norm whose input needs a gradient (all but the first: its input is the frozen embedding's
      output) kept fp32 ``h`` (4N bytes) and, with a trained weight, the bf16 product (2N), now its bf16 input (2N);
      a trained first norm kept the bf16 product (2N), now its input (2N) and ``r`` (rows * seq fp32)."""
    keep, lean = CHANGES[change]
    n, layers = ROWS * SEQ * HIDDEN, LAYERS
    casting = layers * (3 - 1 + 1) * 2 * n
    norms = 2 * layers * (4 + 2 - 2) * n - 4 * ROWS * SEQ if train_norms else 2 * layers * (4 - 2) * n
    return keep * casting + lean * norms


@pytest.mark.parametrize("train_norms", [False, True], ids=["frozen_norms", "train_norms"])
def test_live_bytes_drop_by_what_is_spared(train_norms):
    model, ids = bf16_lora_model(train_norms), batch()
    stock = held_and_peak(model, ids)
    for change in CHANGES:
        off = apply_changes(model, change)
        held, peak = held_and_peak(model, ids)
        off()
        expected = spared_bytes(change, train_norms)
        assert stock[0] - held == expected, (change, stock, (held, peak))
        assert stock[1] - peak >= expected // 2, (change, stock, (held, peak))  # here the peak: in the loss


# --- what is changed, and undone ---


def test_keep_adapter_input_dtype_sets_and_restores_peft_switch():
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = bf16_lora_model()
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    assert len(layers) == 4 * LAYERS and all(layer.cast_input_dtype_enabled for layer in layers)
    restore = keep_adapter_input_dtype(model)
    assert not any(layer.cast_input_dtype_enabled for layer in layers)
    restore()
    assert all(layer.__dict__["cast_input_dtype_enabled"] is True for layer in layers)


def test_keep_adapter_input_dtype_restores_a_missing_value_as_missing():
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = bf16_lora_model()
    layer = next(m for m in model.modules() if isinstance(m, BaseTunerLayer))
    del layer.cast_input_dtype_enabled  # peft's _cast_input_dtype reads True then
    restore = keep_adapter_input_dtype(model)
    assert layer.cast_input_dtype_enabled is False
    restore()
    assert "cast_input_dtype_enabled" not in layer.__dict__


def test_keep_adapter_input_dtype_errors(monkeypatch):
    with pytest.raises(ValueError, match="model=LlamaRMSNorm has no peft tuner layer"):
        keep_adapter_input_dtype(LlamaRMSNorm(8))
    import peft.helpers

    monkeypatch.delattr(peft.helpers, "disable_input_dtype_casting")
    with pytest.raises(ValueError, match=rf"peft=={peft.__version__} .*peft>={input_casting.PEFT_NEEDED}"):
        keep_adapter_input_dtype(bf16_lora_model())


def test_lean_norms_state_dict_unchanged_and_disable_removes_every_attribute():
    model = bf16_lora_model(train_norms=True)
    keys, rng = list(model.state_dict()), torch.get_rng_state()
    disable, names = enable_lean_norms(model)
    assert torch.equal(rng, torch.get_rng_state())  # the probe draws from a generator of its own
    changed = [name for name, m in model.named_modules() if "forward" in m.__dict__]
    assert changed == names and len(names) == 2 * (2 * LAYERS + 1)  # original_module and the trained copy each
    assert list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="already replaced on the instance"):
        enable_lean_norms(model)
    disable()
    disable()  # a second call does nothing
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_the_trained_copy_under_modules_to_save_runs_lean():
    model, ids = bf16_lora_model(train_norms=True), batch()
    copy = model.base_model.model.model.layers[1].input_layernorm.modules_to_save["default"]
    seen = []
    copy.register_forward_hook(lambda module, args, out: seen.append(type(out.grad_fn).__name__))
    disable, _ = enable_lean_norms(model)
    forward(model, ids)
    disable()
    forward(model, ids)
    assert seen == ["LeanRMSNormBackward", "MulBackward0"]


class OffsetRMSNorm(nn.Module):
    """Gemma's formula: ``(1 + weight)`` scales the normalized input (the attributes of a Llama one)."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.zeros(size)), eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def test_a_norm_of_another_formula_is_left_alone():
    model = nn.ModuleDict({"offset": OffsetRMSNorm(16), "llama": LlamaRMSNorm(16)}).to(torch.bfloat16)
    disable, names = enable_lean_norms(model)
    assert names == ["llama"] and "forward" not in model["offset"].__dict__
    disable()
    with torch.device("meta"):  # a process that has not received its weights (FSDP2 reading once): the same verdicts
        meta = nn.ModuleDict({"offset": OffsetRMSNorm(16), "llama": LlamaRMSNorm(16)}).to(torch.bfloat16)
    assert enable_lean_norms(meta)[1] == ["llama"]
