"""How many GPUs a row of a given length needs for finetune's LoRA step, and with which techniques: every split N and
every combination of ``--no-copies`` ("lean"), ``--tiled-mlp`` ("tiled") and ``--offload-checkpoints`` ("offload")
through :func:`.model.predict`, with FSDP2 over all G GPUs (P = G; the GPUs beyond N train other rows), the step as
``finetune`` runs it on a GPU (bf16 weights and autocast, LoRA rank 8 on q/k/v/o, the head loss, AdamW).

A plan **fits** when its bytes per GPU (the model's total plus :data:`MARGIN_GIB` for what the model leaves out) are
at most the GPU's memory and its host bytes per node (a process's offloaded checkpoints times the GPUs of a node,
``min(G, 8)``) at most the node's host memory. **Cost order** (:func:`cost`): the techniques first, none, then
lean, tiled, lean + tiled, offload, lean + offload, tiled + offload, all three (a combination ranks by its costliest
member, then by the next one: counting in binary with lean = 1, tiled = 2, offload = 4), then the smallest N; an N
larger than a node's GPUs comes after every N within a node. Lean is taken as the cheapest technique (it drops copies
and recomputes a norm's fp32 input), the tiled MLP next (its forward runs once more, tile by tile), offloading last
(every checkpoint crosses to the host and back each step). A larger N within a node costs an all-to-all per layer
over the node's links, small beside a long row's attention, and a token costs the same compute whatever N is;
across nodes that all-to-all is slow. The cheapest plan that fits is the one to run; when none fits, the plan
that comes closest (the smallest ratio of bytes to capacity, GPU or host) says what is short.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...attention.ulysses import allowed_sizes
from ...util.did_you_mean import did_you_mean
from .model import Shape, Step, _default_tile, predict, total

GIB = 2**30
# usable GiB (nvidia-smi's total) less a margin for what the model leaves out: CUDA context about 1 GiB, NCCL
# buffers and the allocator's fragmentation 2 GiB
MARGIN_GIB = 3.0
CAPACITY = {"H100 80GB": 79.6, "H200 141GB": 140.4}
HOST_GIB = 2048.0  # host memory of a node of 8 GPUs, by default
NODE_GPUS = 8
FSDP_CONFIG = "examples/accelerate/fsdp.yaml"  # the accelerate config of FSDP2 (from the repository's root)
RANK = 8  # finetune's default LoRA rank (on its default targets, q/k/v/o)
# real configs (hidden, intermediate, layers, heads, kv heads, head dim, vocabulary, tied)
SHAPES = {
    "Llama 3.2 1B": Shape(2048, 8192, 16, 32, 8, 64, 128256, tied=True),
    "Llama 3.1 8B": Shape(4096, 14336, 32, 32, 8, 128, 128256, tied=False),
    "Llama 3.1 70B": Shape(8192, 28672, 80, 64, 8, 128, 128256, tied=False),
    "Qwen2.5 7B": Shape(3584, 18944, 28, 28, 4, 128, 152064, tied=False),  # q, k, v biases not counted
}
TECHNIQUES = ("lean", "tiled", "offload")  # cheapest first
FLAGS = {"lean": "--no-copies", "tiled": "--tiled-mlp", "offload": "--offload-checkpoints"}
# every combination in cost order: combination k holds TECHNIQUES[i] where bit i of k is set
COMBINATIONS = tuple(tuple(t for i, t in enumerate(TECHNIQUES) if k >> i & 1) for k in range(2 ** len(TECHNIQUES)))
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class Plan:
    """One way to run a row: its techniques, the split N over G GPUs, the bytes a GPU holds (the model's total plus
    the margin), the host bytes a node holds, and the moment of the peak (``model.predict``'s "mlp", "norm",
    "attention" or "loss")."""

    techniques: tuple[str, ...]
    sequence_parallel: int
    gpus: int
    gpu_bytes: float
    host_bytes: float
    peak_at: str


def shape_of(config: dict, layers: int | None = None) -> Shape:
    """A model shape from a Llama-like config's keys (``layers``: that many decoder layers instead); a key-value head
    count, a head size and tied embeddings that are not given are transformers' Llama defaults (the heads, hidden /
    heads, untied)."""
    heads = config["num_attention_heads"]
    return Shape(
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=layers or config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied=config.get("tie_word_embeddings", False),
    )


def read_shape(model: str) -> Shape:
    """The shape ``--model`` names: one of :data:`SHAPES`, or a folder holding config.json, or that file (read as
    JSON, nothing imported)."""
    if model in SHAPES:
        return SHAPES[model]
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        known = ", ".join(repr(name) for name in SHAPES)
        raise ValueError(
            f"--model {model!r} is neither a known shape{did_you_mean(model, SHAPES)} nor a folder or file with "
            f"config.json; known shapes: {known}"
        )
    return shape_from_file(path)


def shape_from_file(path: Path) -> Shape:
    """The shape of a config.json; refused, naming ``--model``, when it is not JSON or lacks a key the model needs."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--model {str(path)!r}: cannot read it as JSON ({err})") from None
    missing = [key for key in CONFIG_KEYS if not isinstance(config, dict) or not positive_int(config.get(key))]
    if missing:
        needs = ", ".join(CONFIG_KEYS)
        raise ValueError(
            f"--model {str(path)!r} lacks {', '.join(missing)}: a Llama-like config.json has {needs}, integers >= 1"
        )
    return shape_of(config)


def positive_int(value) -> bool:
    """Whether a config's value is a count: an integer >= 1 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def splits(shape: Shape, tokens: int, gpus: int) -> list[int]:
    """Every sequence-parallel N the code allows on ``gpus`` GPUs: N divides the GPUs and the row's tokens, and the
    heads allow it (N divides the query heads, and divides or is a multiple of the key-value heads, whose copies it
    then holds)."""
    return [n for n in allowed_sizes(shape.heads, shape.kv_heads) if gpus % n == 0 and tokens % n == 0]


def step_of(shape: Shape, tokens: int, gpus: int, n: int, techniques: tuple[str, ...]) -> Step:
    """finetune's step on a GPU with these techniques: the tiled MLP at ALST's default tile of tokens / N."""
    tile = _default_tile(shape.hidden, tokens // n) if "tiled" in techniques else 0
    return Step(tokens, n, gpus, 2, 2, RANK, offload="offload" in techniques, tile=tile, lean="lean" in techniques)


def plan_of(shape: Shape, tokens: int, gpus: int, n: int, techniques: tuple[str, ...]) -> Plan:
    """The bytes of one plan: a GPU's (the model's total plus the margin) and a node's host memory."""
    terms = predict(shape, step_of(shape, tokens, gpus, n, techniques))
    host = terms["host"] * min(gpus, NODE_GPUS)
    return Plan(techniques, n, gpus, total(terms) + MARGIN_GIB * GIB, host, terms["peak_at"])


def cost(plan: Plan) -> tuple[bool, int, int]:
    """The plan's place in the cost order: an N across nodes last, then the techniques' rank in
    :data:`COMBINATIONS`, then N."""
    spans_nodes = plan.sequence_parallel > NODE_GPUS
    return spans_nodes, COMBINATIONS.index(plan.techniques), plan.sequence_parallel


def plans(shape: Shape, tokens: int, gpus: int) -> list[Plan]:
    """Every plan for a row of ``tokens`` on ``gpus`` GPUs, cheapest first (:func:`cost`)."""
    every = [plan_of(shape, tokens, gpus, n, c) for n in splits(shape, tokens, gpus) for c in COMBINATIONS]
    return sorted(every, key=cost)


def fits(plan: Plan, gpu_gib: float, host_gib: float = HOST_GIB) -> bool:
    """Whether the plan's bytes per GPU and host bytes per node are within the GPU's and the node's memory."""
    return plan.gpu_bytes <= gpu_gib * GIB and plan.host_bytes <= host_gib * GIB


def overshoot(plan: Plan, gpu_gib: float, host_gib: float = HOST_GIB) -> float:
    """How far the plan is from fitting: the larger of its bytes over the GPU's and the node's memory (<= 1: fits)."""
    return max(plan.gpu_bytes / (gpu_gib * GIB), plan.host_bytes / (host_gib * GIB))


def choose(candidates: list[Plan], gpu_gib: float, host_gib: float = HOST_GIB) -> tuple[Plan, bool]:
    """The first plan of ``candidates`` (cheapest first) that fits, and True; else the one that comes closest
    (:func:`overshoot`, the cheaper one on a tie), and False."""
    fitting = next((p for p in candidates if fits(p, gpu_gib, host_gib)), None)
    if fitting is not None:
        return fitting, True
    return min(candidates, key=lambda p: overshoot(p, gpu_gib, host_gib)), False


def short(plan: Plan, gpu_gib: float, host_gib: float = HOST_GIB) -> dict:
    """GiB by which the plan overruns each memory (0: within it): "gpu" per GPU, "host" per node."""
    return {"gpu": max(0.0, plan.gpu_bytes / GIB - gpu_gib), "host": max(0.0, plan.host_bytes / GIB - host_gib)}


def finetune_flags(plan: Plan) -> list[str]:
    """The finetune options the plan needs: gradient checkpointing, the split, each technique's flag."""
    words = ["--grad-checkpointing"]
    if plan.sequence_parallel > 1:
        words += ["--sequence-parallel", str(plan.sequence_parallel)]
    return words + [FLAGS[t] for t in plan.techniques]


def command(plan: Plan, tokens: int) -> str:
    """The command line to run the plan (the model, data and output folder left as ``...``): ``hf-rope-ext
    finetune`` on one GPU, else ``accelerate launch`` with :data:`FSDP_CONFIG` on all the GPUs."""
    finetune = " ".join(["finetune --model ... --data ... --out ...", "--length", str(tokens), *finetune_flags(plan)])
    if plan.gpus == 1:
        return f"hf-rope-ext {finetune}"
    nodes = -(-plan.gpus // NODE_GPUS)
    machines = f" --num_machines {nodes}" if nodes > 1 else ""
    launch = f"accelerate launch --config_file {FSDP_CONFIG}{machines} --num_processes {plan.gpus}"
    return f"{launch} -m hf_rope_ext {finetune}"


def as_dict(plan: Plan, gpu_gib: float, host_gib: float = HOST_GIB) -> dict:
    """A plan for JSON: its techniques, N, GiB per GPU and host GiB per node, the peak's moment, whether it fits."""
    return {
        "techniques": list(plan.techniques),
        "sequence_parallel": plan.sequence_parallel,
        "gpu_gib": round(plan.gpu_bytes / GIB, 3),
        "host_gib_per_node": round(plan.host_bytes / GIB, 3),
        "peak_at": plan.peak_at,
        "fits": fits(plan, gpu_gib, host_gib),
    }


# docs/finetune.md's table: rows per model and length, a column per GPU count
LENGTHS = {"128k": 131072, "512k": 524288, "1M": 1048576}
LONGER = {"Llama 3.1 8B": {"2M": 2097152, "4M": 4194304, "16M": 16777216}}
GPUS = (1, 2, 4, 8, 16, 32)
CODES = {"lean": "c", "tiled": "t", "offload": "o"}  # the table's letters: --no-copies, --tiled-mlp, --offload-...


def table_choice(shape: Shape, tokens: int, gpus: int) -> tuple[Plan, str | None]:
    """The table's plan on ``gpus`` GPUs: the cheapest that fits the first GPU of :data:`CAPACITY` that any plan fits
    (with that GPU's name), else the one closest to fitting the largest GPU (and None)."""
    candidates = plans(shape, tokens, gpus)
    for gpu, gib in CAPACITY.items():
        plan, ok = choose(candidates, gib)
        if ok:
            return plan, gpu
    return choose(candidates, max(CAPACITY.values()))[0], None


def cell(plan: Plan, gpu: str | None) -> str:
    """GiB per GPU (bold: fits the first GPU of :data:`CAPACITY`, italic: the second only) / host GiB per node, then
    N and the techniques' letters (:data:`CODES`)."""
    gib = f"{plan.gpu_bytes / GIB:.1f}"
    gib = f"**{gib}**" if gpu == next(iter(CAPACITY)) else f"*{gib}*" if gpu else gib
    codes = "+".join(CODES[t] for t in plan.techniques)
    return f"{gib} / {plan.host_bytes / GIB:.0f} (N{plan.sequence_parallel}{' ' + codes if codes else ''})"


def fewest(shape: Shape, tokens: int, gpu_gib: float) -> str:
    """The fewest of :data:`GPUS` on which a plan fits GPUs of ``gpu_gib``, or "-"."""
    return next((str(g) for g in GPUS if choose(plans(shape, tokens, g), gpu_gib)[1]), "-")


def gpu_table() -> str:
    """docs/finetune.md's "How many GPUs for this length" table: each named Llama and Qwen shape at each length, the
    table's plan (:func:`table_choice`) per GPU count, and the fewest GPUs of each kind of :data:`CAPACITY`."""
    head = " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPUS)
    least = " | ".join(f"fewest {name.split()[0]}s" for name in CAPACITY)
    lines = [f"| model | tokens | {head} | {least} |", "|---|---:|" + "---:|" * (len(GPUS) + len(CAPACITY))]
    for model, shape in SHAPES.items():
        for label, tokens in (LENGTHS | LONGER.get(model, {})).items():
            cells = [cell(*table_choice(shape, tokens, g)) for g in GPUS]
            cells += [fewest(shape, tokens, gib) for gib in CAPACITY.values()]
            lines.append(f"| {model} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
