"""Checkpointed layer inputs kept in host memory (``finetune --offload-checkpoints``).

With non-reentrant activation checkpointing a decoder layer keeps one tensor from its forward to its backward: its
input, which ``torch.utils.checkpoint`` saves as a saved tensor of its own, outside the hooks through which it drops
(and later recomputes) everything the layer saves inside. Saved-tensor hooks (``torch.autograd.graph
.saved_tensors_hooks``) around the checkpoint call therefore see the layer input and nothing else: the pack hook
moves it to host memory when the layer's forward saves it, the unpack hook brings it back when the backward
recomputes the layer. At the peak the device holds two layers' inputs (the one recomputed and the one fetched ahead)
instead of every layer's. This is ALST's "activation checkpoint offload", on the extension points that exist:
transformers' per-layer checkpoint function (``_transformers.checkpointing``) and torch's saved-tensor hooks.

On CUDA the copies run on a side stream into pinned host memory; while the backward recomputes a layer, the input of
the layer before it (the next one the backward reaches) is already copied back on that stream. torch's ``save_on_cpu``
does the copies on the compute stream and copies nothing that already lies on the CPU. Here a CPU step runs the same
mechanism, copies included, into a host pool of its own that ``util.memory_peak.LivePeak`` counts as host memory, so
a CPU process shows what a GPU process would hold; what only a GPU can show (pinning, the copies overlapping the
compute) is not measured on a CPU. The copies are exact: losses and gradients are bitwise those of the step without.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch

from ..._transformers.checkpointing import wrap_checkpoint_function
from ...util.memory_peak import host_allocation


class Packed:
    """One saved layer input: its host copy, and its device copy once fetched back (ahead of use or on demand)."""

    def __init__(self, host: torch.Tensor, device: torch.device, index: int, ready=None):
        self.host, self.device, self.index = host, device, index
        self.ready = ready  # CUDA: the event after which ``host`` holds the data
        self.fetched: torch.Tensor | None = None  # the device copy, made ahead of its unpack
        self.fetched_event = None


class HostPool:
    """The host copies of one model's layer inputs, in the order the forward saved them (the backward unpacks them in
    reverse: unpacking input ``i`` fetches input ``i - 1``). ``stream``: the side stream of the copies (CUDA)."""

    def __init__(self):
        self.order: list[weakref.ref] = []  # this step's Packed entries, in forward order
        self.stream = None

    def pack(self, tensor: torch.Tensor) -> Packed:
        """Saving a layer input: its copy in host memory (the device tensor is freed once no one else holds it)."""
        if self.order and all(ref() is None for ref in self.order):  # a new step: the last one's entries are gone
            self.order.clear()
        host, device, ready = self._to_host(tensor)
        entry = Packed(host, device, len(self.order), ready)
        self.order.append(weakref.ref(entry))
        return entry

    def unpack(self, entry: Packed) -> torch.Tensor:
        """The backward reached the layer: its input on the device; the previous layer's starts on its way."""
        tensor = self._take(entry)
        previous = self.order[entry.index - 1]() if entry.index > 0 else None
        if previous is not None and previous.fetched is None:
            previous.fetched, previous.fetched_event = self._to_device(previous)
        return tensor

    def _take(self, entry: Packed) -> torch.Tensor:
        """The entry's device copy (fetched ahead, or now), handed over: the entry keeps only its host copy."""
        tensor, event = (entry.fetched, entry.fetched_event) if entry.fetched is not None else self._to_device(entry)
        entry.fetched = entry.fetched_event = None
        if event is not None:  # the compute stream waits for the copy, and owns the tensor from here on
            torch.cuda.current_stream(tensor.device).wait_event(event)
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
        return tensor

    def _to_host(self, tensor: torch.Tensor):
        """(host copy, device, event): on CUDA a pinned copy on the side stream, else a copy made at once."""
        if tensor.device.type != "cuda":
            with host_allocation():
                return tensor.detach().clone(memory_format=torch.contiguous_format), tensor.device, None
        stream = self._stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the tensor's producer has finished
        with torch.cuda.stream(stream):
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor.detach(), non_blocking=True)
            tensor.record_stream(stream)  # its memory is not reused before the copy is done
            return host, tensor.device, stream.record_event()

    def _to_device(self, entry: Packed):
        """(device copy, event) of an entry's host copy: on CUDA on the side stream, else a copy made at once."""
        if entry.device.type != "cuda":
            return entry.host.clone(), None
        stream = self._stream(entry.device)
        with torch.cuda.stream(stream):
            stream.wait_event(entry.ready)
            tensor = torch.empty(entry.host.shape, dtype=entry.host.dtype, device=entry.device)
            tensor.copy_(entry.host, non_blocking=True)
            return tensor, stream.record_event()

    def _stream(self, device: torch.device):
        if self.stream is None:
            self.stream = torch.cuda.Stream(device)
        return self.stream


def offloaded(checkpoint: Callable, pool: HostPool) -> Callable:
    """``checkpoint`` (a layer's checkpoint function) with the layer input it saves kept in ``pool``."""

    @functools.wraps(checkpoint)
    def call(function, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pool.pack, pool.unpack):
            return checkpoint(function, *args, **kwargs)

    return call


def offload_checkpoints(model) -> Callable[[], None]:
    """Keep every checkpointed layer input of ``model`` in host memory between its forward and its backward; returns
    the function that undoes it. ValueError when activation checkpointing is off."""
    pool = HostPool()
    return wrap_checkpoint_function(model, lambda checkpoint: offloaded(checkpoint, pool))
