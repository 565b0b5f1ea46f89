"""How many torch operations one decode step's attention call runs, per attention-level rope type.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/decode_ops.py [--cached 8192] [--types rerope xpos]
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/decode_ops.py --model [--cached 1100]

On a GPU a decode step's attention is short work, so its time is set by how many operations it dispatches (each
costs Python dispatch and, for a kernel, a launch): on an H200 the package's types took 1.7-3.6 ms a step after 8k
cached tokens against plain sdpa's 0.15 ms (docs/results/gpu.md). This counts them on any device: the attention module
of ``bench_attention`` (32 / 8 heads, head_dim 128, bf16) steps three times on a rotating cache
(``hf_rope_ext.rope_cache``) holding ``--cached`` random tokens, as ``bench_attention.decode`` steps it, and a
dispatch mode counts the operations of the last step's attention call (views and slices included; those that
return more than ``--large`` elements are counted apart: copies or work that grow with the cache). On a CPU,
``--block-masks`` also builds, for each piece, the block mask the CUDA kernel would give compiled flex
(``flex.kernel_block_mask``), so the count includes that host work too. It counts the plans a GPU runs: on a CPU
Dual Chunk Attention's step of one row reads its chunk boundary back and runs its bands as pieces of their own
(``chunk_decode.HOST_BANDS``), which ``--cpu-plans`` counts instead. ``--model`` counts instead one whole decode
step (embedding, every layer, head) of a 2-layer tiny Llama (hidden 64, 4 / 2 heads, float32) whose rotating cache
(what ``generate`` gives these types) holds the prompt, and gives each type's operations per layer beyond the stock
model's (``default``): what the attention functions add, layers sharing what a step computes once. With
``--padded N`` the step is one of a batch of two rows, the first left-padded by N tokens, as ``generate`` steps a
padded batch; with ``--static`` the cache is a static one (16 slots to spare), stepped eagerly; with ``--user-cache
dynamic|static`` it is the cache a user builds from transformers alone (``DynamicCache(config=...)``,
``StaticCache(config=..., max_cache_len=...)``) and hands to the model, instead of ``hf_rope_ext.rope_cache``.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_rope_ext
from hf_rope_ext.attention.engine import chunk_decode, flex, kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as bench  # noqa: E402
from bench_compiled_decode import SHAPES  # noqa: E402

# operations that hand a value back to Python: on a GPU each waits for every kernel queued before it (a host sync)
SYNCS = ("aten.equal.", "aten._local_scalar_dense.", "aten.is_nonzero.", "aten.nonzero.")


class Counted(TorchDispatchMode):
    """Counts the operations dispatched inside it: all of them, those returning more than ``large`` elements, and
    those that read a value back to Python (``SYNCS``, and ``Tensor.tolist``, which reads a CPU tensor without a
    dispatched operation)."""

    def __init__(self, large: int):
        super().__init__()
        self.large, self.ops, self.big = large, collections.Counter(), collections.Counter()
        self.syncs = 0

    def __enter__(self):
        def tolist(tensor):
            self.syncs += 1
            return read(tensor)

        read = torch.Tensor.tolist
        self.patched = mock.patch.object(torch.Tensor, "tolist", tolist)
        self.patched.start()
        return super().__enter__()

    def __exit__(self, *exc):
        self.patched.stop()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops[str(func)] += 1
        self.syncs += str(func).startswith(SYNCS)
        if any(isinstance(t, torch.Tensor) and t.numel() > self.large for t in torch.utils._pytree.tree_leaves(out)):
            self.big[str(func)] += 1
        return out


def with_block_masks(kernel):
    """``kernel`` (the CPU one) building first the block mask the CUDA kernel gives flex for the piece."""

    def call(q, k, v, piece, scale):
        flex.kernel_block_mask(q, k, v, piece)
        return kernel(q, k, v, piece, scale)

    return call


def last_step_ops(name: str, cached: int, large: int, device: str, block_masks: bool = False) -> Counted:
    """The counter of the last of ``bench_attention.decode``'s three steps of ``name`` after ``cached`` tokens
    (``block_masks``: with the CUDA kernel's block masks, on a CPU)."""
    if block_masks:
        with mock.patch.dict(kernels.KERNELS, cpu=with_block_masks(kernels.KERNELS["cpu"])):
            return last_step_ops(name, cached, large, device)
    found: list[Counted] = []

    def attention(module, *args, **kwargs):
        with Counted(large) as counter:
            out = ALL_ATTENTION_FUNCTIONS["sdpa"](module, *args, **kwargs)
        found.append(counter)
        bench.LAST_CALL[:] = [(0.0, 0.0)]  # what bench.decode reads after each step: no time taken here
        return out

    AttentionInterface.register(bench.TIMED, attention)
    module = bench.attention_module(bench.TYPES[name], 128, device, torch.bfloat16)
    bench.decode(module, cached, 128, torch.bfloat16, device, steps=2)
    return found[-1]


def tiny_llama(rope: dict, layers: int = 2) -> LlamaForCausalLM:
    """A float32 Llama of ``bench_compiled_decode``'s toy shape with ``layers`` layers using ``rope``."""
    shape = {**SHAPES["toy"], "num_hidden_layers": layers}
    config = LlamaConfig(**shape, max_position_embeddings=4096, rope_parameters={"rope_theta": 10000.0, **rope})
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def padded_inputs(cached: int, padded: int) -> dict:
    """A prompt of ``cached`` tokens: one row, or (``padded`` > 0) two rows, the first left-padded by ``padded``,
    with the mask and positions ``generate`` gives them."""
    rows = 2 if padded else 1
    ids = torch.randint(3, 97, (rows, cached), generator=torch.Generator().manual_seed(0))
    if not padded:
        return {"input_ids": ids}
    mask = torch.ones(rows, cached, dtype=torch.long)
    mask[0, :padded] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def next_inputs(inputs: dict, logits: torch.Tensor) -> dict:
    """The inputs of the step after ``inputs`` (mask and positions grown by one where there are)."""
    step = {"input_ids": logits[:, -1:].argmax(-1)}
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
        step["attention_mask"] = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), -1)
        step["position_ids"] = inputs["position_ids"][:, -1:] + 1
    return step


def model_step_ops(
    name: str, cached: int, large: int, layers: int = 2, padded: int = 0, static: bool = False, user: str | None = None
):
    """The counter of the third decode step of a tiny Llama (``tiny_llama``) using ``name`` after ``cached`` tokens
    (``padded``: of a batch of two rows, the first left-padded by that many, as ``padded_inputs``; ``static``: on a
    static cache with 16 slots to spare, stepped eagerly; ``user``: on transformers' own "dynamic" or "static" cache
    built as a user would, not the package's)."""
    model = tiny_llama(bench.TYPES[name], layers)
    cache = (
        user_cache(model, user, cached + 16) if user else hf_rope_ext.rope_cache(model, cached + 16 if static else None)
    )
    keyword = {hf_rope_ext.cache_keyword(model): cache}
    inputs = padded_inputs(cached, padded)
    with torch.no_grad():
        logits = model(**inputs, **keyword).logits
        for _ in range(2):
            inputs = next_inputs(inputs, logits)
            logits = model(**inputs, **keyword).logits
        with Counted(large) as counter:
            model(**next_inputs(inputs, logits), **keyword)
    return counter


def user_cache(model, kind: str, slots: int):
    """transformers' own cache as a user builds it: ``DynamicCache(config=...)`` or a ``StaticCache`` of ``slots``."""
    from transformers import DynamicCache, StaticCache

    if kind == "dynamic":
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=slots)


def model_table(args) -> None:
    """Operations of a whole step per type, and per layer beyond the stock model's."""
    cache = (args.padded, args.static, args.user_cache)
    stock_counter = model_step_ops("default", args.cached, args.large, args.layers, *cache)
    stock = sum(stock_counter.ops.values())
    batch = f", 2 rows, one left-padded by {args.padded}" if args.padded else ""
    batch += ", static cache" if args.static else ""
    batch += f", the user's own {args.user_cache} cache" if args.user_cache else ""
    print(
        f"| rope_type | operations per model step (after {args.cached} tokens, {args.layers} layers{batch}) "
        "| beyond stock, per layer | host syncs |"
    )
    print("| --- | ---: | ---: | ---: |")
    print(f"| default | {stock} | 0.0 | {stock_counter.syncs} |")
    for name in [n for n in args.types if n != "default"]:
        counter = model_step_ops(name, args.cached, args.large, args.layers, *cache)
        total = sum(counter.ops.values())
        print(f"| {name} | {total} | {(total - stock) / args.layers:.1f} | {counter.syncs} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cached", type=int, default=8192, help="tokens in the cache before the steps")
    parser.add_argument("--types", nargs="+", default=list(bench.TYPES), choices=list(bench.TYPES))
    parser.add_argument("--large", type=int, default=100_000, help="elements above which an output counts as large")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--block-masks", action="store_true", help="on a CPU, also build the CUDA kernel's masks")
    parser.add_argument("--model", action="store_true", help="count whole decode steps of a tiny Llama instead")
    parser.add_argument("--layers", type=int, default=2, help="layers of --model's Llama")
    parser.add_argument("--padded", type=int, default=0, help="--model: a batch of two, one left-padded by this")
    parser.add_argument("--static", action="store_true", help="--model: on a static cache, stepped eagerly")
    parser.add_argument(
        "--user-cache",
        choices=("dynamic", "static"),
        default=None,
        help="--model: on transformers' own cache built as a user would, not hf_rope_ext.rope_cache",
    )
    parser.add_argument(
        "--cpu-plans",
        action="store_true",
        help="count the CPU's plans (Dual Chunk Attention's step of one row reads its chunk boundary), not a GPU's",
    )
    args = parser.parse_args(argv)
    if not args.cpu_plans:  # the plans a GPU runs: nothing read back
        chunk_decode.HOST_BANDS = set()
    if args.padded and not (args.model and 0 < args.padded < args.cached):
        parser.error(f"--padded {args.padded} needs --model and 0 < --padded < --cached ({args.cached})")
    if (args.static or args.user_cache) and not args.model:
        parser.error("--static and --user-cache count a whole model's step: add --model")
    if args.static and args.user_cache:
        parser.error("--static is the package's static cache; --user-cache static is transformers' own: pick one")
    if args.model:
        model_table(args)
        return 0
    if args.block_masks and args.device != "cpu":
        parser.error(f"--block-masks counts the CUDA kernel's masks on a CPU; --device is {args.device!r}, not 'cpu'")
    print(
        f"| rope_type | operations per decode step (after {args.cached} tokens) | of them large | host syncs "
        "| largest kinds |"
    )
    print("| --- | ---: | ---: | ---: | --- |")
    for name in args.types:
        counter = last_step_ops(name, args.cached, args.large, args.device, args.block_masks)
        kinds = ", ".join(f"{op} x{n}" for op, n in counter.big.most_common(3)) or "-"
        print(
            f"| {name} | {sum(counter.ops.values())} | {sum(counter.big.values())} | {counter.syncs} | {kinds} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
