"""``hf-rope-ext plan``: how to fit a row of a given length on G GPUs: every split N and every combination of
finetune's memory techniques, their predicted GiB per GPU and host GiB per node (``train.memory.planner``), and the
cheapest plan that fits with the command that runs it. Exit status 0 when a plan fits, 1 when none does."""

from __future__ import annotations

import json

from .args import positive_float, positive_int


def add_parser(subparsers, name):
    parser = subparsers.add_parser(
        name,
        help="which techniques and sequence-parallel split fit a row of a given length on G GPUs (predicted)",
        description=(
            "Predict, from the memory model of one LoRA step (bf16, rank 8 on q/k/v/o, the head loss, AdamW, FSDP2 "
            "over all GPUs), the GiB per GPU and the host GiB per node of every plan: each sequence-parallel N and "
            "each combination of --no-copies, --tiled-mlp and --offload-checkpoints; print them and the cheapest "
            "plan that fits, with its finetune flags. Exit status 0 when one fits, 1 when none does."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        help="a shape name ('Llama 3.2 1B', 'Llama 3.1 8B', 'Llama 3.1 70B', 'Qwen2.5 7B'), or a model folder or "
        "config.json (read as JSON)",
    )
    parser.add_argument("--length", type=positive_int, required=True, help="tokens per row")
    parser.add_argument("--gpus", type=positive_int, required=True, help="GPUs in all (8 a node)")
    parser.add_argument(
        "--gpu-memory",
        type=positive_float,
        required=True,
        metavar="GIB",
        help="usable GiB of one GPU (nvidia-smi's total: 79.6 for an H100 80GB, 140.4 for an H200)",
    )
    parser.add_argument(
        "--host-memory",
        type=positive_float,
        default=None,
        metavar="GIB",
        help="host GiB of one node, which holds min(G, 8) GPUs (default 2048)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def report(args) -> dict:
    """Everything the command says, as one dict (what ``--json`` prints)."""
    from dataclasses import asdict

    from ..train.memory import planner

    shape, host = planner.read_shape(args.model), args.host_memory or planner.HOST_GIB
    candidates = planner.plans(shape, args.length, args.gpus)
    chosen, fits = planner.choose(candidates, args.gpu_memory, host)
    return {
        "model": args.model,
        "shape": asdict(shape),
        "length": args.length,
        "gpus": args.gpus,
        "gpu_memory_gib": args.gpu_memory,
        "host_memory_gib": host,
        "margin_gib": planner.MARGIN_GIB,
        "plans": [planner.as_dict(p, args.gpu_memory, host) for p in candidates],
        "fits": fits,
        "plan": planner.as_dict(chosen, args.gpu_memory, host),
        "flags": planner.finetune_flags(chosen),
        "command": planner.command(chosen, args.length),
        "short_gib": planner.short(chosen, args.gpu_memory, host),
    }


def techniques(plan: dict) -> str:
    """A plan's techniques as finetune's flags ("none" for none)."""
    from ..train.memory.planner import FLAGS

    return " ".join(FLAGS[t] for t in plan["techniques"]) or "none"


def table(result: dict) -> str:
    """Every plan, cheapest first: N, techniques, GiB per GPU, host GiB per node, the peak's moment, fits."""
    lines = ["| N | techniques | GiB per GPU | host GiB per node | peak at | fits |", "|---:|---|---:|---:|---|---|"]
    for p in result["plans"]:
        lines.append(
            f"| {p['sequence_parallel']} | {techniques(p)} | {p['gpu_gib']:.1f} | {p['host_gib_per_node']:.0f} "
            f"| {p['peak_at']} | {'yes' if p['fits'] else 'no'} |"
        )
    return "\n".join(lines)


def verdict(result: dict) -> str:
    """The cheapest plan that fits and its command, or what the closest plan is short of and by how much."""
    p, gpu, host = result["plan"], result["gpu_memory_gib"], result["host_memory_gib"]
    what = f"N={p['sequence_parallel']} with {techniques(p)}"
    use = f"{p['gpu_gib']:.1f} GiB per GPU of {gpu:g}, {p['host_gib_per_node']:.0f} host GiB per node of {host:g}"
    if result["fits"]:
        return f"cheapest plan that fits: {what} ({use})\n  {result['command']}"
    short, parts = result["short_gib"], []
    if short["gpu"]:
        parts.append(f"GPU memory by {short['gpu']:.1f} GiB ({p['gpu_gib']:.1f} GiB per GPU against {gpu:g})")
    if short["host"]:
        parts.append(
            f"host memory by {short['host']:.1f} GiB ({p['host_gib_per_node']:.0f} GiB per node against {host:g})"
        )
    return f"no plan fits; the closest, {what}, is short of " + " and ".join(parts)


def run(args) -> int:
    result = report(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        s = result["shape"]
        print(
            f"{args.model}: {s['layers']} layers, hidden {s['hidden']}, intermediate {s['intermediate']}, "
            f"{s['heads']} heads ({s['kv_heads']} key-value); a row of {args.length} tokens on {args.gpus} GPUs "
            f"of {args.gpu_memory:g} GiB ({result['margin_gib']:g} GiB of each kept for what the model leaves out)\n"
        )
        print(f"{table(result)}\n\n{verdict(result)}")
    return 0 if result["fits"] else 1
