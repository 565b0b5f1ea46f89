"""A Llama-style RMSNorm that keeps its half-precision input for the backward instead of an fp32 copy of it, and
makes its fp32 temporaries over chunks of tokens, not over the whole row.

``LlamaRMSNorm.forward`` computes ``h = x.to(float32)``, ``var = h.pow(2).mean(-1, keepdim=True)``,
``n = h * rsqrt(var + eps)`` and ``weight * n.to(x.dtype)``: autograd keeps ``h`` (fp32, 4 bytes an element) for the
backward of ``pow`` and of ``h * r``, and, when the weight is trained (``--train-norms``), ``n.to(x.dtype)`` too. With a
bf16/fp16 ``x`` that fp32 copy is needless: ``x.to(float32)`` is exact, so the backward can make it again from ``x``
(2 bytes an element). :class:`LeanRMSNorm` keeps ``x``, the fp32 reciprocal RMS ``r`` (shape ``(..., 1)``) and the
weight, and nothing else.

Chunks: every op but the weight gradient's sum works on each token's own D values, so :class:`LeanRMSNorm` runs its
forward and its input gradient over chunks of tokens (rows of the (tokens, D) view; ``norm_chunks.chunk_sizes``, the
rule ``norm_chunks.CHUNK_BYTES``), writing each chunk's result into a tensor made once for the row (the output and
``r``, or the input gradient): its fp32 temporaries are one chunk's (``norm_chunks.chunk_peak_bytes``), whatever the
row's length. Writing
into one tensor holds less than ``torch.cat`` of the chunks' results, which holds them all beside the joined copy
(two half-precision rows against one; tests/test_no_copies.py measures both). The weight's gradient is a sum over the
tokens: it is summed over the whole row as the stock backward sums it (chunks would change the order of the sum), only
its factor ``n.to(x.dtype)`` is made chunk by chunk. A tensor whose strides allow no (tokens, D) view (a transposed
input) runs as one chunk.

Bit for bit: the forward runs the stock ops in the stock order, and the backward replays the ops torch's autograd
formulas run for that graph (``derivatives.yaml``: mul ``grad * other``, ``_to_copy`` casts the grad back, rsqrt
``-0.5 * grad * result.pow(3)``, mean ``grad.expand(shape) / n``, pow ``grad * (2 * self)``), with the engine's own
steps between them (a grad is summed to its input's shape, then cast to its input's dtype; the two grads of ``h`` are
added). Some run in place on a temporary no longer needed, with the same arithmetic element for element
(``a.mul_(b)`` for ``b * a``; the expanded mean gradient divided once per token). A chunk's per-token sums over D see
the values the whole row's see, in the same order (``norm_chunks.MIN_CHUNK``). Output, input grad and weight grad are
``torch.equal`` to the stock module's on a CPU, the chunks engaged or not (tests/test_no_copies.py).

:func:`enable_lean_norms` gives the lean forward to every Llama-style RMSNorm of a model as an instance attribute
(``module.forward``; parameters and state-dict keys unchanged), and its disable function deletes exactly those
attributes. Which modules: the class name ends in ``RMSNorm``, the module has a ``weight`` parameter and a
``variance_epsilon`` attribute, and on a small random probe (a random weight, inputs in the weight's dtype, bf16 and
fp16) its own forward and backward equal the lean function's bit for bit; any other formula (Gemma's
``(1 + weight)``, a norm without the fp32 upcast, a kernel) is left alone. A norm under peft's ``modules_to_save``
(``--train-norms``) is two modules, ``original_module`` and the trained copy ``modules_to_save.<adapter>``: the walk
finds both, so the copy that runs is lean too. Enable after ``get_peft_model`` (its copy is made when it wraps).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable

import torch
from torch import nn

from .norm_chunks import _all_rows, _chunks, _rows

HALF = (torch.bfloat16, torch.float16)  # input dtypes with an fp32 copy to spare
PROBE_SHAPE = (2, 3)  # leading dims of the probe input; the last is the norm's size
PROBE_SEED = 0  # a generator of its own: the probe draws nothing from the global RNG


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm.forward`` op for op: x (..., D) any float dtype, weight (D,); autograd keeps fp32 ``h``."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


class LeanRMSNorm(torch.autograd.Function):
    """The Llama RMSNorm keeping ``x`` (half), ``r`` (fp32, (..., 1)) and the weight, over chunks of tokens; see the
    module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        r, out = _forward(x, weight, eps)
        ctx.save_for_backward(x, r, weight)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, r, weight = ctx.saved_tensors
        # the weight's first: its row-wide factor is freed before the input gradient is made
        grad_w = _weight_grad(grad, x, r, weight) if ctx.needs_input_grad[1] else None
        grad_x = _input_grad(grad, x, r, weight) if ctx.needs_input_grad[0] else None
        return grad_x, grad_w, None


def _forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(r (..., 1) fp32, the output (..., D) in the promoted dtype and x's layout, as the stock's) of x (..., D) half,
    chunk by chunk (:func:`_forward_chunk`)."""
    x_rows = _rows(x)
    if x_rows is None:
        return _forward_chunk(x, weight, eps)
    out = torch.empty_like(x, dtype=torch.promote_types(weight.dtype, x.dtype))  # x's layout: a (tokens, D) view
    r = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    out_rows, r_rows = _rows(out), _rows(r)
    for part in _chunks(x_rows.shape[0], x.shape[-1]):
        r_rows[part] = _forward_chunk(x_rows[part], weight, eps, out=out_rows[part])[0]
    return r, out


def _forward_chunk(x, weight, eps, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock forward of x (..., D) half: (r (..., 1) fp32, the output, in ``out`` where given). fp32 temporaries:
    ``h`` and ``h.pow(2)``, then ``h`` and ``h * r`` beside its half cast."""
    h = x.to(torch.float32)  # (..., D) fp32: exact
    variance = h.pow(2).mean(-1, keepdim=True)  # (..., 1) fp32: a mean over each token's own D values
    r = torch.rsqrt(variance + eps)  # (..., 1) fp32
    return r, torch.mul(weight, (h * r).to(x.dtype), out=out)


def _to_input(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """What autograd's engine does to a grad before it reaches an input: sum to its shape, then cast to its dtype."""
    grad = grad.sum_to_size(shape)
    return grad if grad.dtype == dtype else grad.to(dtype)


def _normed(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The forward's ``(h * r).to(x.dtype)`` (..., D) in x's dtype and layout (the stock's ``h`` has x's layout), made
    chunk by chunk: fp32 temporaries a chunk's ``h`` and ``h * r``."""
    rows = _all_rows(x, r)
    if rows is None:
        return (x.to(torch.float32) * r).to(x.dtype)
    normed = torch.empty_like(x)  # x's layout: a (tokens, D) view
    normed_rows = _rows(normed)
    for part in _chunks(rows[0].shape[0], x.shape[-1]):
        normed_rows[part] = rows[0][part].to(torch.float32) * rows[1][part]  # the copy casts as .to does
    return normed


def _weight_grad(grad: torch.Tensor, x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """MulBackward0 of ``weight * normed`` for the weight: ``grad * normed`` summed to (D,) over the whole row (a sum
    over tokens: chunks would change its order). The product is made in ``normed``'s place where that is the stock
    product's dtype and layout (grad of x's dtype and strides), else beside it, as the stock's: at most two row-wide
    tensors in grad's dtype beside grad."""
    normed = _normed(x, r)
    if grad.dtype == normed.dtype and grad.stride() == normed.stride():
        product = normed.mul_(grad)  # normed * grad == grad * normed bit for bit, in the layout the stock's has
    else:
        product = grad * normed
    del normed
    return _to_input(product, weight.shape, weight.dtype)


def _input_grad(grad: torch.Tensor, x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The stock backward from the output to x (..., D): grad (..., D) in the output's dtype, r (..., 1) fp32; the
    input gradient (x's dtype and layout) written chunk by chunk (:func:`_input_grad_chunk`)."""
    rows = _all_rows(grad, x, r)
    if rows is None:
        return _input_grad_chunk(grad, x, r, weight).to(x.dtype)
    grad_x = torch.empty_like(x)  # x's layout: a (tokens, D) view
    grad_x_rows = _rows(grad_x)
    for part in _chunks(rows[0].shape[0], x.shape[-1]):
        grad_x_rows[part] = _input_grad_chunk(rows[0][part], rows[1][part], rows[2][part], weight)  # cast as .to
    return grad_x


def _input_grad_chunk(grad, x, r, weight) -> torch.Tensor:
    """The fp32 input gradient (ToCopyBackward0 of ``x.to(float32)`` is the caller's cast) of the tokens of x (..., D)
    half, grad (..., D), r (..., 1) fp32: autograd's ops on the same values, some in place (``grad_normed`` becomes
    the gradient of h, ``h`` becomes ``2 h`` times the mean's gradient). fp32 (..., D) temporaries: at most
    :data:`CHUNK_FP32` (``h``, ``grad_normed`` and their product)."""
    h = x.to(torch.float32)  # (..., D) fp32: exact, the same values the forward had
    grad_normed = _to_input(grad * weight, h.shape, x.dtype).to(torch.float32)  # MulBackward0, then ToCopyBackward0
    grad_r = _to_input(grad_normed * h, r.shape, r.dtype)  # MulBackward0 of h * r, for r: (..., 1)
    grad_h = grad_normed.mul_(r)  # ... and for h, in grad_normed's place: grad_normed * r
    grad_variance = -0.5 * grad_r * r.pow(3)  # RsqrtBackward0 (the + eps passes it through): (..., 1)
    grad_square = grad_variance / h.shape[-1]  # MeanBackward1: each token's value of grad.expand(h.shape) / D
    pow_grad = h.mul_(2.0).mul_(grad_square)  # PowBackward0: grad_square * (2.0 * h), in h's place
    return grad_h.add_(pow_grad)  # added to the other grad of h


def lean_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama RMSNorm of x (..., D): :class:`LeanRMSNorm` for a bf16/fp16 x; the stock ops otherwise (an fp32
    x is its own ``h``: there is no copy to spare; a wider x would keep more than its fp32 copy)."""
    if x.dtype in HALF:
        return LeanRMSNorm.apply(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def _lean_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The forward :func:`enable_lean_norms` binds to a module (``self.weight``, ``self.variance_epsilon``)."""
    return lean_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def looks_llama_style(module: nn.Module) -> bool:
    """The name and attributes of a Llama-style RMSNorm; :func:`computes_lean` checks the formula."""
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), nn.Parameter)
        and hasattr(module, "variance_epsilon")
    )


def _probe_outputs(fn, x: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
    """fn(x, weight) and the grads of x and weight for a fixed output grad: the probe's evidence (the output alone
    where it is not one tensor with a grad, e.g. a tuple: then it cannot equal the lean function's)."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    with torch.enable_grad():
        out = fn(x, weight)
        if not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return [out]
        grad = torch.ones_like(out).mul_(0.75)
        return [out, *torch.autograd.grad(out, (x, weight), grad, allow_unused=True)]


def _with_weight(module: nn.Module, weight: torch.Tensor) -> nn.Module:
    """A shallow copy of ``module`` whose weight is ``weight``: the probe runs the class's forward on it (no hooks,
    nothing of the module itself touched)."""
    probe = copy.copy(module)
    probe._parameters = {**module._parameters, "weight": weight}
    return probe


def _same_bits(stock, lean: torch.Tensor) -> bool:
    """One piece of probe evidence equal bit for bit (a missing grad or another type is not)."""
    return isinstance(stock, torch.Tensor) and stock.dtype == lean.dtype and torch.equal(stock, lean)


def computes_lean(module: nn.Module) -> bool:
    """Whether the module's class forward (the one the lean forward would shadow) equals :func:`lean_rms_norm` bit
    for bit, forward and backward, on a random weight and random inputs (..., D) in the weight's dtype, bf16, fp16; on
    the CPU for a weight on the meta device (a process that has not received its weights yet: only the shape and dtype
    are read)."""
    weight = module.weight
    device = torch.device("cpu") if weight.is_meta else weight.device
    generator = torch.Generator(device=device).manual_seed(PROBE_SEED)
    probe_weight = torch.randn(weight.shape, generator=generator, device=device).to(weight.dtype)
    for dtype in dict.fromkeys((weight.dtype, *HALF)):
        x = torch.randn((*PROBE_SHAPE, weight.shape[-1]), generator=generator, device=device).mul(3).to(dtype)
        stock = _probe_outputs(lambda a, w: type(module).forward(_with_weight(module, w), a), x, probe_weight)
        lean = _probe_outputs(lambda a, w: lean_rms_norm(a, w, module.variance_epsilon), x, probe_weight)
        if len(stock) != len(lean) or not all(map(_same_bits, stock, lean)):
            return False
    return True


def _check_own_forward(name: str, module: nn.Module) -> None:
    """A module whose ``forward`` is already an instance attribute (a hook's wrapper, lean norms enabled twice)."""
    if "forward" in module.__dict__:
        raise ValueError(
            f"module {name!r}: forward={module.__dict__['forward']!r} is already replaced on the instance; "
            "allowed: a norm running its class's forward (enable lean norms once, before any forward-wrapping hook)"
        )


def _disabler(changed: list[tuple[str, nn.Module]]) -> Callable[[], None]:
    """Deletes the lean forward from each changed module (once; a second call does nothing)."""
    pending = list(changed)

    def disable() -> None:
        while pending:
            name, module = pending.pop()
            current = module.__dict__.get("forward")
            if getattr(current, "__func__", None) is not _lean_forward:
                raise ValueError(f"module {name!r}: forward={current!r}; allowed: the lean forward installed on it")
            del module.forward

    return disable


def enable_lean_norms(model: nn.Module) -> tuple[Callable[[], None], list[str]]:
    """Lean forwards on every Llama-style RMSNorm of ``model`` (see the module docstring for which); returns the
    function that removes them and the names of the modules changed (empty: nothing was changed)."""
    changed = []
    for name, module in model.named_modules():
        if looks_llama_style(module):
            _check_own_forward(name, module)
            if computes_lean(module):
                changed.append((name, module))
    for _, module in changed:
        module.forward = types.MethodType(_lean_forward, module)  # an instance attribute: no state-dict key
    return _disabler(changed), [name for name, _ in changed]
