"""``hf-rope-ext eval --sequence-parallel N`` under ``torchrun --nproc_per_node N``: each evaluation row split over the
N processes as ``finetune --sequence-parallel N`` splits a training row (``train.split_reading``), so a row too long
for one process is evaluated on N. Every process loads the model and reads the same rows; each keeps its shard of a
row, attention runs through the Ulysses all-to-all, and the shards' token losses and argmax predictions are gathered,
so every process computes the same records and the first writes them. The measures that read rows are split:
perplexity, the last-chunk loss, the teacher-forced passkey; those that generate (passkey by generation, the pass-key
probes, RULER, the needle heatmap) run on one process and are refused by name."""

from __future__ import annotations

import os

from .args import positive_int


def add_argument(parser) -> None:
    parser.add_argument(
        "--sequence-parallel",
        type=positive_int,
        default=1,
        metavar="N",
        help="under torchrun --nproc_per_node N: each row split over the N processes, as finetune --sequence-parallel "
        "N trains (perplexity, last-chunk loss, teacher-forced passkey; add --no-generate)",
    )


def check_measures(args) -> None:
    """Refuse, before any work, the measures a split evaluation does not run, and a launch of another size."""
    n = args.sequence_parallel
    if n == 1:
        return
    generating = {"--probes": args.probes, "--ruler": args.ruler, "--needle": args.needle}
    generating["passkey by generation (add --no-generate)"] = args.passkey_depths and not args.no_generate
    for name, asked in generating.items():
        if asked:
            raise ValueError(f"--sequence-parallel {n}: {name} generates token by token on one process; not split")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != n:
        raise ValueError(
            f"--sequence-parallel {n} runs under torchrun --nproc_per_node {n} (this run has {world} process(es))"
        )


def check_lengths(args, lengths: list[int]) -> None:
    """Every evaluation row must split into N equal shards."""
    n, odd = args.sequence_parallel, [x for x in lengths if x % args.sequence_parallel]
    if odd:
        raise ValueError(f"--lengths {lengths}: a row of {odd[0]} tokens does not split into {n}; use multiples of {n}")


def reading(args):
    """(reader, losses, predict, is_main) for ``evaluate``: the split reading over this run's N processes (gloo on the
    CPU, where the evaluation runs), or the evaluation's own reading (None, None, None, True) for N = 1."""
    if args.sequence_parallel == 1:
        return None, None, None, True
    import torch.distributed as dist

    from ..eval.perplexity import CachedLosses
    from ..train.sequence_parallel import make_group
    from ..train.split_reading import SplitReader

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    reader = SplitReader(make_group(args.sequence_parallel, dist.get_world_size(), rank))
    return reader, CachedLosses(reader.losses), reader.predictions, rank == 0


def stamped(records: list[dict], reader) -> list[dict]:
    """Each record of a split run with its N and the tokens of each row every process read (``shard_tokens``)."""
    if reader is None:
        return records
    return [
        {**r, "sequence_parallel": reader.sequence.size, "shard_tokens": reader.shards[r["length"]]} for r in records
    ]
