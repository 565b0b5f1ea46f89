"""A Llama-style RMSNorm that keeps its half-precision input for the backward instead of an fp32 copy of it.

``LlamaRMSNorm.forward`` computes ``h = x.to(float32)``, ``var = h.pow(2).mean(-1, keepdim=True)``,
``n = h * rsqrt(var + eps)`` and ``weight * n.to(x.dtype)``: autograd keeps ``h`` (fp32, 4 bytes an element) for the
backward of ``pow`` and of ``h * r``, and, when the weight is trained (``--train-norms``), ``n.to(x.dtype)`` too. With a
bf16/fp16 ``x`` that fp32 copy is needless: ``x.to(float32)`` is exact, so the backward can make it again from ``x``
(2 bytes an element). :class:`LeanRMSNorm` keeps ``x``, the fp32 reciprocal RMS ``r`` (shape ``(..., 1)``) and the
weight, and nothing else.

Bit for bit: the forward runs the stock ops in the stock order, and the backward replays the ops torch's autograd
formulas run for that graph (``derivatives.yaml``: mul ``grad * other``, ``_to_copy`` casts the grad back, rsqrt
``-0.5 * grad * result.pow(3)``, mean ``grad.expand(shape) / n``, pow ``grad * (2 * self)``), with the engine's own
steps between them (a grad is summed to its input's shape, then cast to its input's dtype; the two grads of ``h`` are
added). Output, input grad and weight grad are ``torch.equal`` to the stock module's on a CPU (tests/test_no_copies.py).

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
    """The Llama RMSNorm keeping ``x`` (half), ``r`` (fp32, (..., 1)) and the weight; see the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.to(torch.float32)  # (..., D) fp32: made here, dropped on return
        variance = h.pow(2).mean(-1, keepdim=True)
        r = torch.rsqrt(variance + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, r, weight)
        return weight * (h * r).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, r, weight = ctx.saved_tensors
        h = x.to(torch.float32)  # exact: the same fp32 values the forward had
        normed = (h * r).to(x.dtype)  # (..., D) in x's dtype: the weight's other factor
        grad_x = _input_grad(grad, h, r, weight, x.dtype) if ctx.needs_input_grad[0] else None
        grad_w = _weight_grad(grad, normed, weight) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None


def _to_input(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """What autograd's engine does to a grad before it reaches an input: sum to its shape, then cast to its dtype."""
    grad = grad.sum_to_size(shape)
    return grad if grad.dtype == dtype else grad.to(dtype)


def _weight_grad(grad: torch.Tensor, normed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """MulBackward0 of ``weight * normed`` for the weight: ``grad * normed`` summed to (D,)."""
    return _to_input(grad * normed, weight.shape, weight.dtype)


def _input_grad(grad, h, r, weight, input_dtype) -> torch.Tensor:
    """The stock backward from the output to ``x``: grad (..., D) in the output's dtype, h (..., D) fp32, r (..., 1)."""
    grad_normed = _to_input(grad * weight, h.shape, input_dtype).to(torch.float32)  # MulBackward0, then ToCopyBackward0
    grad_h = grad_normed * r  # MulBackward0 of h * r, for h
    grad_r = _to_input(grad_normed * h, r.shape, r.dtype)  # ... and for r: (..., 1)
    grad_variance = -0.5 * grad_r * r.pow(3)  # RsqrtBackward0 (the + eps passes it through)
    grad_square = grad_variance.expand(h.shape) / h.shape[-1]  # MeanBackward1
    grad_h = grad_h + grad_square * (2.0 * h)  # PowBackward0, added to the other grad of h
    return grad_h.to(input_dtype)  # ToCopyBackward0 of x.to(float32)


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
    for bit, forward and backward, on a random weight and random inputs (..., D) in the weight's dtype, bf16, fp16."""
    weight = module.weight
    if weight.is_meta:
        raise ValueError(f"{type(module).__name__}.weight on device=meta; allowed: a materialized weight (cpu, cuda)")
    generator = torch.Generator(device=weight.device).manual_seed(PROBE_SEED)
    probe_weight = torch.randn(weight.shape, generator=generator, device=weight.device).to(weight.dtype)
    for dtype in dict.fromkeys((weight.dtype, *HALF)):
        x = torch.randn((*PROBE_SHAPE, weight.shape[-1]), generator=generator, device=weight.device).mul(3).to(dtype)
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
