"""The rows each optimizer step trains on: one loader per stage, whose batch order is a permutation drawn from (seed,
stage, epoch) alone, so that every process and a resumed run see the same rows in the same order.

Many processes: the loader yields *global* micro-batches of ``batch_size x data-parallel processes`` rows and accelerate
hands each process its slice (``split_batches``; :func:`data_parallel` says which processes get different rows).
"""

from __future__ import annotations

import torch


class EpochSampler(torch.utils.data.Sampler):
    """A permutation of [0, n) that depends on (seed, epoch) only: identical on every process and after a resume."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def data_parallel(accelerator) -> tuple[int, int]:
    """(data-parallel size, this process' data-parallel rank): processes that get different rows. Tensor- and
    context-parallel ranks of one group share their rows, as accelerate's ``prepare_data_loader`` shards them."""
    mesh = getattr(accelerator, "torch_device_mesh", None)
    if mesh is None:
        return accelerator.num_processes, accelerator.process_index
    names = mesh.mesh_dim_names or ()
    size = {name: mesh[name].size() for name in names}
    shared = size.get("tp", 1) * size.get("cp", 1)
    return size.get("dp_replicate", 1) * size.get("dp_shard", 1), accelerator.process_index // shared


def stage_loaders(accelerator, datasets, batch_size: int, seed: int):
    """One prepared DataLoader per stage: global micro-batches of ``batch_size x data-parallel size`` rows (full ones
    only), of which accelerate (``split_batches``) gives each process its ``batch_size`` rows, in rank order; the
    batch order of stage i is drawn from (``seed``, i, epoch)."""
    if not accelerator.split_batches:
        raise ValueError("the training loop needs an Accelerator with DataLoaderConfiguration(split_batches=True)")
    global_batch = batch_size * data_parallel(accelerator)[0]
    loaders = []
    for index, dataset in enumerate(datasets):
        rows = dataset.with_format("torch", columns=[c for c in ("input_ids", "labels") if c in dataset.column_names])
        sampler = EpochSampler(len(rows), seed * 131 + index)
        # its own generator: starting an epoch must not draw from the global RNG (dropout), or resume would drift
        own = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(
            rows, batch_size=global_batch, sampler=sampler, drop_last=True, generator=own
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
