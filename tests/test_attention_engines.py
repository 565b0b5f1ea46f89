"""Every method on every engine: the reference engine (eager), the fast engine with the CPU kernel, and the fast
engine as it runs on CUDA, here on CPU with the CUDA kernel swapped for CPU functions of the same signature and
meaning (``cuda_twins``: a dense one, one that reads the block lists as compiled flex_attention does, and the CUDA
kernel's own code taking torch's fused op first, the op a twin), and for the CUDA kernel's own code run uncompiled
(flex_attention on CPU: forward only, every pair through ``mask_mod``). The kernel (``kernels.KERNELS``) and the rows
per piece (``kernels.WHOLE_BANDS``: each band one piece on CUDA, a few past ``WHOLE_ROWS``) are what differ between
devices; the twin runs take both of CUDA's, so the planning and merging are the CUDA path's.
``scripts/mutate_cuda_path.py`` breaks the CUDA path's block lists and plan on purpose and shows these tests fail.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import ENGINE_PARAMS_WITH_DYNAMIC_YARN, fast_plans, tiny_model
from cuda_twins import block_list_kernel, dense_kernel, fused_kernel
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import fast, flex, kernels, lse, masked, rotated_cache, single_band, two_band
from hf_rope_ext.attention.engine.piece import Piece
from hf_rope_ext.attention.methods.form import PLAIN
from hf_rope_ext.types import registry
from hf_rope_ext.util import recompile_limit

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

PARAMS = ENGINE_PARAMS_WITH_DYNAMIC_YARN
TYPES = sorted(PARAMS)
LENGTH = 40


CUDA_TWINS = {
    "dense": dense_kernel,
    "blocks": block_list_kernel,
    "flex": flex.flex_kernel(),
    "fused": fused_kernel(SDPBackend.CUDNN_ATTENTION),  # torch's fused op first (``dense_ops``), as on CUDA
}
DIFFERENTIABLE_TWINS = ("dense", "blocks", "fused")  # uncompiled flex has no backward on CPU


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(two_band, "near_block", lambda window: 3)
    monkeypatch.setattr(two_band, "FAR_BLOCK", 7)
    monkeypatch.setattr(single_band, "ROWS", 7)
    monkeypatch.setattr(masked, "MASK_BUDGET", 2 * LENGTH * 6)
    monkeypatch.setattr(flex, "BLOCK", 8)  # flex blocks smaller than the pieces: partly and fully allowed ones


def module_of(name: str, **overrides):
    model = tiny_model("llama", {"rope_type": name, **PARAMS[name], **overrides}, num_hidden_layers=1)
    return model.model.layers[0].self_attn


def tensors(batch=2, q_len=LENGTH, kv=LENGTH, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(batch, 4, q_len, 16, generator=g), *torch.randn(2, batch, 2, kv, 16, generator=g)
    return tuple(t.to(dtype).requires_grad_(grad) for t in (q, k, v))


def left_padding(length=LENGTH):
    keep = torch.ones(2, length, dtype=torch.bool)
    keep[1, :6] = False
    mask = torch.ones(length, length, dtype=torch.bool).tril() & keep[:, None, :]
    return mask[:, None], (keep.long().cumsum(-1) - 1).clamp(min=0)


CASES = {
    "prefill": lambda: (None, torch.arange(LENGTH)[None]),
    "shifted": lambda: (None, torch.arange(7, 7 + LENGTH)[None]),
    "left-padding": left_padding,
}


def outputs(module, case, kernel=None, dtype=torch.float32, grad=False, monkeypatch=None):
    """{engine: (output, grads or None)} of one call: eager, sdpa on the CPU kernel, sdpa on ``kernel``."""
    mask, pos = CASES[case]()
    found = {}
    for engine, implementation in (("reference", "eager"), ("cpu", "sdpa"), ("cuda-twin", "sdpa")):
        if engine == "cuda-twin":  # the CUDA path: its kernel's twin, its plan (whole bands)
            monkeypatch.setitem(kernels.KERNELS, "cpu", kernel)
            monkeypatch.setattr(kernels, "WHOLE_BANDS", {"cpu", "cuda"})
        q, k, v = tensors(dtype=dtype, grad=grad)
        out = function.attend(implementation, module, q, k, v, mask, position_ids=pos)[0]
        valid = torch.ones(2, LENGTH, dtype=torch.bool) if mask is None else mask[:, 0].any(-1)
        grads = None
        if grad:
            weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            (out * weights * valid[..., None, None]).sum().backward()
            grads = (q.grad, k.grad, v.grad)
        found[engine] = (out[valid].float(), grads)
    monkeypatch.setitem(kernels.KERNELS, "cpu", kernels.cpu_flash)
    monkeypatch.setattr(kernels, "WHOLE_BANDS", {"cuda"})
    return found


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("twin", sorted(CUDA_TWINS))
@pytest.mark.parametrize("name", TYPES)
def test_every_engine_agrees_in_float32(name, twin, case, monkeypatch):
    found = outputs(module_of(name), case, CUDA_TWINS[twin], monkeypatch=monkeypatch)
    for engine in ("cpu", "cuda-twin"):
        torch.testing.assert_close(found[engine][0], found["reference"][0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("ramp", [3, 7])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("twin", sorted(CUDA_TWINS))
def test_every_engine_agrees_on_string_with_a_ramp(twin, case, ramp, monkeypatch):
    """STRING's ``ramp`` (the far band's query moved back by a shift that grows with m, not by one constant), the
    ramp (m = S - 1 .. S - 1 + R) inside the 40 tokens."""
    module = module_of("string", window=9, local_window=2, ramp=ramp)
    found = outputs(module, case, CUDA_TWINS[twin], monkeypatch=monkeypatch)
    for engine in ("cpu", "cuda-twin"):
        torch.testing.assert_close(found[engine][0], found["reference"][0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("twin", DIFFERENTIABLE_TWINS)
@pytest.mark.parametrize("name", TYPES)
def test_every_engine_agrees_in_bfloat16(name, twin, monkeypatch):
    """Within two bf16 steps (2 * 2^-8) of the reference engine's largest output."""
    found = outputs(module_of(name), "prefill", CUDA_TWINS[twin], dtype=torch.bfloat16, monkeypatch=monkeypatch)
    reference = found["reference"][0]
    for engine in ("cpu", "cuda-twin"):
        error = (found[engine][0] - reference).abs().max() / reference.abs().max()
        assert error <= 2 * 2**-8, f"{engine}: {error:.2e}"


@pytest.mark.parametrize("twin", DIFFERENTIABLE_TWINS)
@pytest.mark.parametrize("case", ["shifted", "left-padding"])
@pytest.mark.parametrize("name", TYPES)
def test_every_engine_has_the_reference_gradients(name, case, twin, monkeypatch):
    found = outputs(module_of(name).train(), case, CUDA_TWINS[twin], grad=True, monkeypatch=monkeypatch)
    for engine in ("cpu", "cuda-twin"):
        for grad, expected in zip(found[engine][1], found["reference"][1], strict=True):
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5)


def plan(name: str) -> str | None:
    return fast.plan_of(registry.get_method(name).attention or PLAIN)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("name", [n for n in TYPES if plan(n) in ("single", "two")])
def test_cuda_plan_runs_each_band_as_one_piece(name, grad, monkeypatch):
    """A 40-token prefill on the CUDA path's plan calls the kernel at most once per band (one-band types without
    autograd: torch's sdpa, no piece), where the CPU plan (blocks of 3 to 7 rows here) calls it for every block: on
    CUDA the number of calls, each costing milliseconds, does not grow with the length. Dual Chunk Attention is not
    among them: its pieces are the method's chunks on every device."""
    calls = []

    def counted(*args):
        calls.append(args[3])
        return dense_kernel(*args)

    monkeypatch.setitem(kernels.KERNELS, "cpu", counted)
    module, pos, pieces = module_of(name).train(grad), torch.arange(LENGTH)[None], {}
    for device, whole in (("cpu", {"cuda"}), ("cuda", {"cpu", "cuda"})):
        monkeypatch.setattr(kernels, "WHOLE_BANDS", whole)
        calls.clear()
        q, k, v = tensors(grad=grad)
        function.attend("sdpa", module, q, k, v, None, position_ids=pos)
        pieces[device] = len(calls)
    assert pieces["cuda"] <= {"single": 1, "two": 2}[plan(name)] < pieces["cpu"], pieces


@pytest.mark.parametrize("twin", ["fused", "blocks"])
@pytest.mark.parametrize("name", TYPES)
def test_a_long_band_on_the_cuda_plan_runs_in_a_few_pieces(name, twin, monkeypatch):
    """Past WHOLE_ROWS rows (8 here) a band on the CUDA plan is cut into BAND_PARTS pieces of equal rows, not into
    the CPU's row blocks, so its calls stay as few at any length and a piece's temporaries a quarter of the band's;
    every type still gives the reference's output."""
    monkeypatch.setattr(kernels, "WHOLE_ROWS", 8)
    assert kernels.piece_rows(torch.device("cuda"), 3, LENGTH) == LENGTH // kernels.BAND_PARTS
    assert kernels.piece_rows(torch.device("cuda"), 3, 6) == 8 and kernels.piece_rows(torch.device("cpu"), 3, 6) == 3
    calls = []

    def counted(*args):
        calls.append(args[3])
        return CUDA_TWINS[twin](*args)

    found = outputs(module_of(name), "prefill", counted, monkeypatch=monkeypatch)
    torch.testing.assert_close(found["cuda-twin"][0], found["reference"][0], rtol=0, atol=1e-5)
    if plan(name) in ("single", "two"):  # two-band: 4 window pieces, 4 far blocks of two pieces (one-band: 4 x 2)
        assert 0 < len(calls) <= 12, len(calls)


def refuse_sdpa(*args, **kwargs):
    raise AssertionError("torch's sdpa called with autograd")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", [n for n in TYPES if plan(n) == "single"])
def test_gradients_of_one_band_types_never_go_through_torch_sdpa(name, case, monkeypatch):
    """With autograd every chunk of a one-band type (xPos, RoPER, dynamic YaRN) runs as the kernel's pieces, whose
    gradients were right on an H200 where those of torch's sdpa were not (``engine.single_band``); the twin's
    gradients still equal the reference's. Without autograd the same call is one sdpa call (every row in one chunk)."""
    monkeypatch.setattr(single_band, "ROWS", LENGTH)
    monkeypatch.setattr(single_band, "F", SimpleNamespace(scaled_dot_product_attention=refuse_sdpa))
    found = outputs(module_of(name).train(), case, dense_kernel, grad=True, monkeypatch=monkeypatch)
    for grad, expected in zip(found["cuda-twin"][1], found["reference"][1], strict=True):
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5)
    with pytest.raises(AssertionError, match="torch's sdpa"), torch.no_grad():
        outputs(module_of(name), case, dense_kernel, monkeypatch=monkeypatch)


@pytest.mark.parametrize("twin", DIFFERENTIABLE_TWINS)
@pytest.mark.parametrize("name", TYPES)
def test_cuda_twin_decode_steps_equal_the_reference(name, twin, monkeypatch):
    """Decode steps on a growing cache (rows remembered between steps) with the CUDA path's kernel."""
    module = module_of(name)
    q, k, v = tensors(q_len=3, kv=LENGTH + 3)
    for step in range(3):
        kv = LENGTH + step + 1
        args = (q[:, :, step : step + 1], k[:, :, :kv].clone(), v[:, :, :kv].clone(), None)
        pos = torch.tensor([[kv - 1]])
        expected = function.attend("eager", module, *args, position_ids=pos)[0]
        monkeypatch.setitem(kernels.KERNELS, "cpu", CUDA_TWINS[twin])
        got = function.attend("sdpa", module, *args, position_ids=pos)[0]
        monkeypatch.setitem(kernels.KERNELS, "cpu", kernels.cpu_flash)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    rotated_cache.forget(module)


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns (of ``dtype`` only, if given)."""

    def __init__(self, dtype=None):
        super().__init__()
        self.largest, self.dtype = 0, dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and self.dtype in (None, t.dtype):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", TYPES)
def test_cuda_path_never_builds_a_query_by_key_tensor(name, monkeypatch):
    """Prefill of 512 tokens on the CUDA path's CPU twin: no tensor (scores, masks, anything) as large as a
    quarter of the B x H x q x kv score matrix; the reference engine builds one, as a check of the measure."""
    if not fast_plans(name):
        pytest.skip("the fast engine plans no such declaration: the reference engine runs it")
    monkeypatch.setattr(two_band, "near_block", lambda window: 16)
    monkeypatch.setattr(two_band, "FAR_BLOCK", 64)
    monkeypatch.setattr(single_band, "ROWS", 64)
    module, length = module_of(name), 512
    q, k, v = tensors(batch=1, q_len=length, kv=length)
    pos, scores = torch.arange(length)[None], 4 * length * length
    found = {}
    for implementation in ("sdpa", "eager"):
        monkeypatch.setitem(kernels.KERNELS, "cpu", dense_kernel)
        with LargestTensor() as mode:
            function.attend(implementation, module, q, k, v, None, position_ids=pos)
        found[implementation] = mode.largest
    assert found["sdpa"] < scores // 4 <= found["eager"], found


PIECES = [  # (piece, rows, columns)
    (Piece(), 20, 30),
    (Piece(low=0), 20, 20),  # causal square
    (Piece(row0=13, column0=9, low=0, high=5), 20, 24),  # a near-band window
    (Piece(row0=30, low=5), 20, 45),  # shifted causal: keys n <= m - 5
    (Piece(row0=3, low=0, high=2), 12, 40),  # most columns outside every row's range
    (Piece(row0=7, low=0, high=14), 16, 16),  # a block whose distances run from low to high exactly (0..14)
    (Piece(row0=7, low=0, high=15), 16, 16),  # the same block fully allowed: its smallest distance is low exactly
]


@pytest.mark.parametrize("twin", ["flex", "blocks"])
@pytest.mark.parametrize("gqa", [1, 2])
@pytest.mark.parametrize("index", range(len(PIECES)))
def test_flex_block_masks_equal_the_dense_meaning(index, gqa, twin):
    piece, rows, columns = PIECES[index]
    g = torch.Generator().manual_seed(index)
    q, k, v = torch.randn(2, 4, rows, 16, generator=g), *torch.randn(2, 2, 4 // gqa, columns, 16, generator=g)
    found = CUDA_TWINS[twin](q, k, v, piece, 0.3)
    for got, expected in zip(found, dense_kernel(q, k, v, piece, 0.3), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("twin", ["flex", "blocks"])
def test_flex_with_a_given_mask_and_rows_that_see_nothing(twin):
    g = torch.Generator().manual_seed(7)
    allowed = torch.rand(2, 1, 20, 30, generator=g) > 0.5
    allowed[0, 0, 3] = False
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    q, k, v = torch.randn(2, 4, 20, 16, generator=g), *torch.randn(2, 2, 2, 30, 16, generator=g)
    (out, lse), (out_d, lse_d) = (kernel(q, k, v, Piece(mask=mask), 0.3) for kernel in (CUDA_TWINS[twin], dense_kernel))
    torch.testing.assert_close(out, out_d, rtol=0, atol=1e-5)
    assert torch.equal(lse.isinf(), lse_d.isinf()) and bool(lse[0, :, 3].isneginf().all())
    torch.testing.assert_close(lse[lse_d.isfinite()], lse_d[lse_d.isfinite()], rtol=0, atol=1e-5)


@pytest.mark.parametrize("index", range(len(PIECES)))
def test_flex_block_lists_are_the_blocks_of_the_dense_mask(index):
    """Uncompiled flex_attention applies the mask function everywhere and ignores the block lists, which the
    compiled CUDA kernel relies on: each block is listed fully allowed exactly when all its (row, column) pairs
    are allowed, partly when some but not all are, not at all when none is (blocks of 8 over ragged edges)."""
    piece, rows, columns = PIECES[index]
    d = torch.arange(piece.row0, piece.row0 + rows)[:, None] - torch.arange(piece.column0, piece.column0 + columns)
    allowed = (d >= piece.low) & (d < piece.high)
    partly, fully = flex.range_blocks(piece, rows, columns, "cpu")
    for i in range(partly.shape[0]):
        for j in range(partly.shape[1]):
            block = allowed[8 * i : 8 * i + 8, 8 * j : 8 * j + 8]
            assert bool(fully[i, j]) == bool(block.all()), (i, j)
            assert bool(partly[i, j]) == (bool(block.any()) and not bool(block.all())), (i, j)


def test_block_lists_skip_blocks_outside_the_range():
    """A window piece over 64 x 64 with blocks of 8: each row block lists at most 2 key blocks."""
    partly, fully = flex.range_blocks(Piece(low=0, high=8), 64, 64, "cpu")
    assert int((partly | fully).sum(-1).max()) <= 2


@pytest.mark.parametrize("rows, columns", [(1, 40), (16, 16), (5, 3)])
def test_a_piece_seeing_every_key_gets_a_block_mask_of_full_blocks(rows, columns):
    """Given no block mask, compiled flex builds its own inside the graph and ran a decode step's single query row
    22x slower on an H200 (docs/results/gpu.md): a piece that cuts nothing (a decode step's far band, a short square) is
    given a block mask listing every key block of every query block as full, none as partial. No two of its lists
    share storage: dynamo guards compiled flex's inputs against aliasing (torch 2.9.0 raised a TypeError reporting
    that guard's failure)."""
    piece = Piece(row0=columns - 1, low=0)  # row a sees keys j <= columns - 1 + a: all of them
    assert not piece.cuts(rows, columns)
    block_mask = flex.piece_block_mask(piece, 2, rows, columns, "cpu")
    row_blocks, column_blocks = -(-rows // 8), -(-columns // 8)
    assert block_mask.full_kv_num_blocks.tolist() == [[[column_blocks] * row_blocks]]
    assert block_mask.kv_num_blocks.tolist() == [[[0] * row_blocks]]
    lists = (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    assert len({t.untyped_storage().data_ptr() for t in lists}) == 4


class Dispatched(TorchDispatchMode):
    """Counts the torch operations dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_decode_step_reuses_the_full_lists_of_its_shape():
    """A decode step's pieces cut no key and meet the same block shape for BLOCK steps in a row: the next step's
    block mask (one key more, the same blocks) dispatches no torch operation and shares the lists, with its own
    sequence lengths. Lists first made under inference mode are ordinary tensors, so a backward may save them. A
    piece of more than one row block (a prefill's) builds its lists each time: the cache holds small ones only."""
    flex.kept_full_block_lists.cache_clear()
    with torch.inference_mode():
        first = flex.piece_block_mask(Piece(row0=41, low=0), 1, 1, 42, "cpu")  # blocks of 8: 6 key blocks
    assert not any(t.is_inference() for t in (first.kv_num_blocks, first.kv_indices, first.full_kv_num_blocks))
    with Dispatched() as dispatched:
        second = flex.piece_block_mask(Piece(row0=42, low=0), 1, 1, 43, "cpu")
    assert dispatched.count == 0
    assert second.full_kv_indices is first.full_kv_indices and second.seq_lengths == (1, 43) != first.seq_lengths
    assert second.full_kv_indices.tolist() == [[[list(range(6))]]]
    sees_all = Piece(row0=49, low=0)  # 9 rows (two row blocks) over 50 keys, row a seeing keys j <= 49 + a
    assert not sees_all.cuts(9, 50)
    longer = [flex.piece_block_mask(sees_all, 1, 9, 50, "cpu") for _ in range(2)]
    assert longer[0].full_kv_indices is not longer[1].full_kv_indices  # built anew: not kept
    assert longer[0].kv_num_blocks.tolist() == [[[0, 0]]]
    assert longer[0].full_kv_indices.tolist() == [[[list(range(7))] * 2]]


@pytest.mark.parametrize("piece", [Piece(low=0, high=6), Piece(row0=19, low=0)], ids=["window", "sees-all"])
@pytest.mark.parametrize("grad", ["q", "k", "v", None])
def test_the_kernel_builds_the_lists_by_key_block_only_for_a_backward(grad, piece):
    """Only flex's backward reads the lists by key block (which query blocks each key block meets); building them took
    58 of the 103 operations of a decode step's block mask, so the kernel asks for them exactly where q, k or v needs
    a gradient, and they are then the lists by query block transposed (blocks of 8; a window piece, and one that
    sees every key and takes the kept full lists)."""
    seen = []

    def flex_attention(q, k, v, block_mask, scale, enable_gqa, return_aux):
        seen.append(block_mask)
        return torch.zeros_like(q), SimpleNamespace(lse=torch.zeros(q.shape[:3]))

    q, k, v = torch.randn(1, 4, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    if grad is not None:
        dict(q=q, k=k, v=v)[grad].requires_grad_()
    flex.flex_kernel(flex_attention)(q, k, v, piece, 1.0)
    (block_mask,) = seen
    if grad is None:
        assert block_mask.q_num_blocks is None and block_mask.full_q_num_blocks is None
        return
    partly, fully = flex.range_blocks(piece, 20, 20, "cpu")  # [query block, key block]
    for blocks, counts, indices in (
        (partly, block_mask.q_num_blocks, block_mask.q_indices),
        (fully, block_mask.full_q_num_blocks, block_mask.full_q_indices),
    ):
        for j in range(blocks.shape[1]):
            listed = indices[0, 0, j, : int(counts[0, 0, j])].tolist()
            assert listed == torch.nonzero(blocks[:, j]).flatten().tolist(), j


@pytest.mark.parametrize("index", range(len(PIECES) + 1))
def test_a_piece_cuts_exactly_when_a_pair_is_out_of_its_range(index):
    """``Piece.cuts`` decides whether a kernel applies the range at all (the CPU flash op and the block mask):
    it must be True whenever one pair falls outside, including a pair at distance ``high`` exactly."""
    piece, rows, columns = (*PIECES, (Piece(row0=7, low=0, high=14), 8, 8))[index]
    assert piece.cuts(rows, columns) == (not bool(piece.allowed(rows, columns, "cpu").all()))


def test_the_compiled_kernel_keeps_compiling_past_dynamos_default_limit():
    """Twelve variants of one compiled function (a shape each): under ``with_recompile_limit`` each is compiled (a
    variant past the limit would raise here instead of running uncompiled), and dynamo's own setting is as before
    outside the call. On an H200 the default of 8 was reached within one type's checks and flex then ran unfused."""
    config = torch._dynamo.config
    before = getattr(config, recompile_limit.LIMIT_NAME)
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    call = recompile_limit.with_recompile_limit(compiled)
    with config.patch(fail_on_recompile_limit_hit=True):
        for n in range(1, 13):
            assert torch.equal(call(torch.ones(n)), torch.full((n,), 3.0))
    assert getattr(config, recompile_limit.LIMIT_NAME) == before < 12 <= recompile_limit.RECOMPILE_LIMIT
    with config.patch(fail_on_recompile_limit_hit=True), pytest.raises(Exception, match="recompile"):
        for n in range(13, 13 + before + 1):  # the same function without the wrapper: a fresh one hits the default
            torch.compile(lambda x: x - 1, backend="eager", dynamic=False)(torch.ones(n))


def test_the_cuda_kernel_calls_compiled_flex_under_the_raised_limit(monkeypatch):
    """compiled_flex_kernel's flex runs with dynamo's limit at RECOMPILE_LIMIT (seen from inside the call)."""
    seen, real_compile = [], torch.compile

    def fake_compile(function, **options):
        if function is not flex.flex_attention:  # flex_attention's own use of torch.compile when run uncompiled
            return real_compile(function, **options)
        assert options == {"dynamic": True}

        def run(*args, **kwargs):
            seen.append(getattr(torch._dynamo.config, recompile_limit.LIMIT_NAME))
            return function(*args, **kwargs)

        return run

    monkeypatch.setattr(flex.torch, "compile", fake_compile)
    q = k = v = torch.randn(1, 2, 8, 16)
    out, lse = flex.compiled_flex_kernel.__wrapped__()(q, k, v, Piece(0, 0, 0), 0.25)
    assert seen == [recompile_limit.RECOMPILE_LIMIT] and out.shape == q.shape and lse.shape == q.shape[:3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_in_place_half_precision_merge_works_a_slice_of_rows_at_a_time(dtype, monkeypatch):
    """Without autograd a bf16/fp16 merge writes into the first output slice by slice (100 rows, 7 a slice: 15
    slices, the last of 2 rows), never holding a float32 tensor of more than MERGE_ELEMENTS, and equals the
    out-of-place merge bit for bit; rows empty in one piece (lse -inf) take the other's output."""
    monkeypatch.setattr(lse, "MERGE_ELEMENTS", 1000)
    generator = torch.Generator().manual_seed(0)
    o1, o2 = (torch.randn(1, 2, 100, 64, generator=generator).to(dtype) for _ in range(2))
    l1, l2 = (torch.randn(1, 2, 100, generator=generator) for _ in range(2))
    l1[0, 0, :5] = -torch.inf
    expected, expected_lse = lse.merge((o1, l1), (o2, l2))
    with LargestTensor(torch.float32) as mode:
        got, got_lse = lse.merge((o1.clone(), l1), (o2, l2), inplace=True)
    assert mode.largest <= 1000 < o1.numel()
    assert torch.equal(got, expected) and torch.equal(got_lse, expected_lse)
    assert torch.equal(got[0, 0, :5], o2[0, 0, :5])


def refuse(plan: str):
    def call(*args, **kwargs):
        raise AssertionError(f"a left-padded decode step took {plan}")

    return call


@pytest.mark.parametrize("twin", ["cpu", *CUDA_TWINS])
@pytest.mark.parametrize("name", TYPES)
def test_left_padded_decode_steps_take_the_decode_plans_and_equal_the_reference(name, twin, monkeypatch):
    """Steps of a batch whose first row is left-padded so far that, at first, every key beyond its window is padding
    (its far band empty) and whose second is not: the decode plans of an unmasked step with each row's padding hidden,
    on the CPU kernel and on the CUDA path's (twins, and its own flex code run uncompiled)."""
    module = module_of(name)
    pad = LENGTH - 3
    q, k, v = tensors(q_len=6, kv=LENGTH + 6)
    if twin != "cpu":
        monkeypatch.setitem(kernels.KERNELS, "cpu", CUDA_TWINS[twin])
    for step in range(6):
        kv = LENGTH + step + 1
        keep = torch.ones(2, kv, dtype=torch.bool)
        keep[0, :pad] = False
        args = (q[:, :, step : step + 1], k[:, :, :kv].clone(), v[:, :, :kv].clone(), keep[:, None, None, :])
        pos = keep.long().sum(-1, keepdim=True) - 1
        expected = function.attend("eager", module, *args, position_ids=pos)[0]
        with monkeypatch.context() as refused:
            for plan in ("two_band_masked", "single_band"):
                refused.setattr(fast, plan, refuse(plan))
            refused.setattr(function.reference, "run", refuse("the reference engine"))
            got = function.attend("sdpa", module, *args, position_ids=pos)[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    rotated_cache.forget(module)
