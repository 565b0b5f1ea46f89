"""The rows each optimizer step trains on: one loader per stage, whose batch order is a permutation drawn from (seed,
stage, epoch) alone, so that every process and a resumed run see the same rows in the same order.

Many processes: the loader yields *global* micro-batches of ``batch_size x data-parallel processes`` rows and accelerate
hands each process its slice (``split_batches``; :func:`data_parallel` says which processes get different rows).
"""

from __future__ import annotations

import torch


class EpochSampler(torch.utils.data.Sampler):
    """A permutation of [0, n) that depends on (seed, epoch) only: identical on every process and after a resume.

    Cut into global micro-batches of ``groups`` blocks of ``block`` rows (an incomplete last one dropped), each block
    given ``repeats`` times in a row: the ranks of a sequence group (``repeats`` of them, consecutive) then receive
    the same rows from accelerate's ``split_batches``. With ``repeats`` 1 it is the permutation itself."""

    def __init__(self, n: int, seed: int, block: int = 1, groups: int = 1, repeats: int = 1):
        self.n, self.seed, self.epoch = n, seed, 0
        self.block, self.groups, self.repeats = block, groups, repeats

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        order = torch.randperm(self.n, generator=generator)
        if self.repeats == 1:
            return iter(order.tolist())
        used = self.n // (self.block * self.groups) * self.block * self.groups
        blocks = order[:used].view(-1, 1, self.block)  # (batches x groups, 1, block)
        return iter(blocks.expand(-1, self.repeats, -1).flatten().tolist())

    def __len__(self) -> int:
        if self.repeats == 1:
            return self.n
        return self.n // (self.block * self.groups) * self.block * self.groups * self.repeats


def data_parallel(accelerator, sequence_parallel: int = 1) -> tuple[int, int]:
    """(data-parallel size, this process' data-parallel rank): processes that get different rows. Tensor- and
    context-parallel ranks of one group share their rows, as accelerate's ``prepare_data_loader`` shards them, and so
    do the ``sequence_parallel`` consecutive ranks of a sequence group."""
    mesh = getattr(accelerator, "torch_device_mesh", None)
    if mesh is None:
        return accelerator.num_processes // sequence_parallel, accelerator.process_index // sequence_parallel
    names = mesh.mesh_dim_names or ()
    size = {name: mesh[name].size() for name in names}
    shared = size.get("tp", 1) * size.get("cp", 1)
    return size.get("dp_replicate", 1) * size.get("dp_shard", 1), accelerator.process_index // shared


def stage_loaders(accelerator, datasets, batch_size: int, seed: int, sequence_parallel: int = 1):
    """One prepared DataLoader per stage: global micro-batches of ``batch_size x data-parallel size`` rows (full ones
    only), of which accelerate (``split_batches``) gives each process its ``batch_size`` rows, in rank order (each
    row to every rank of its sequence group); the batch order of stage i is drawn from (``seed``, i, epoch)."""
    if not accelerator.split_batches:
        raise ValueError("the training loop needs an Accelerator with DataLoaderConfiguration(split_batches=True)")
    groups = data_parallel(accelerator, sequence_parallel)[0]
    loaders = []
    for index, dataset in enumerate(datasets):
        rows = dataset.with_format("torch", columns=[c for c in ("input_ids", "labels") if c in dataset.column_names])
        sampler = EpochSampler(len(rows), seed * 131 + index, batch_size, groups, sequence_parallel)
        # its own generator: starting an epoch must not draw from the global RNG (dropout), or resume would drift
        own = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(
            rows, batch_size=batch_size * groups * sequence_parallel, sampler=sampler, drop_last=True, generator=own
        )
        loaders.append(accelerator.prepare(loader))
    return loaders


def micro_batches(accelerator, loader, start: int):
    """Micro-batches of one stage from micro-batch index ``start`` on, epoch after epoch (never ends)."""
    per_epoch = len(loader)
    epoch, skip = divmod(start, per_epoch)
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        epoch, skip = epoch + 1, 0
