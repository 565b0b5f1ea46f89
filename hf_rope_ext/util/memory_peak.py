"""The peak of live tensor bytes during a block of code, on any device (the CPU included), by a dispatch mode.

:class:`LivePeak` is a ``TorchDispatchMode``: every op run inside it is seen after autograd (the backward's ops
too), and each storage an op's outputs hold is counted once, by ``untyped_storage().nbytes()``, from the op that
created it until the storage is freed (``weakref.finalize`` on the storage: torch keeps one Python object per live
storage). ``peak`` is the largest sum reached. Storages that existed before the block (weights, inputs, anything
made outside it) are not counted: the ones the block's ops read are summed in ``baseline`` instead.

    with LivePeak() as live:
        loss = step(); loss.backward()
    print(live.peak, live.baseline, live.at_peak)  # bytes; at_peak: {op name: bytes} of what was live at the peak

Device bytes and host bytes are counted apart: ``peak`` and ``live`` are the device's (what
``torch.cuda.max_memory_allocated`` sees on CUDA), ``host_peak`` and ``host_live`` the host memory the step's tensors
hold beside them (offloaded activations). A storage is host when it lies on the CPU while the step runs on another
device, or, for a step on the CPU, when it was made inside :func:`host_allocation` (the CPU is then both, and the
code that moves a tensor to host memory says so), so a CPU step counts an offload as a GPU step would.

What it does not see: a kernel's own scratch memory that no op output holds (it is freed inside the call), and
allocator overhead or fragmentation (the resident peak, ``resident_peak_bytes``, shows those beside it).
"""

from __future__ import annotations

import resource
import sys
import threading
import weakref
from collections import Counter
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_HOST = threading.local()  # depth: how many host_allocation blocks the thread is inside


@contextmanager
def host_allocation():
    """Storages made inside this block are host memory to :class:`LivePeak`, on whatever device they lie."""
    _HOST.depth = getattr(_HOST, "depth", 0) + 1
    try:
        yield
    finally:
        _HOST.depth -= 1


def _in_host_block() -> bool:
    return getattr(_HOST, "depth", 0) > 0


class LivePeak(TorchDispatchMode):
    """Counts live storages created inside the mode; ``peak``, ``live`` and ``baseline`` in bytes (the device's),
    ``host_peak`` and ``host_live`` (host memory); ``device``: where the step runs ("cpu", "cuda").

    ``explain=True`` also keeps ``at_peak``: bytes live at the peak per creating op (``aten.<op>``), to tell
    what fills it (each rise of the peak copies the per-op sums: slower, for diagnosis)."""

    def __init__(self, explain: bool = False, device: str | torch.device = "cpu"):
        super().__init__()
        self.device = torch.device(device).type
        self.live = 0
        self.peak = 0
        self.host_live = 0
        self.host_peak = 0
        self._host: set[int] = set()  # ids of the storages made here that are host memory
        self.baseline = 0
        self.explain = explain
        self.at_peak: dict[str, int] = {}
        self._sizes: dict[int, int] = {}  # id of a storage made inside the mode -> its counted bytes
        self._ops: dict[int, str] = {}  # the same ids -> the op that made it (explain)
        self._by_op: Counter[str] = Counter()
        self._before: set[int] = set()  # ids of storages from before the mode (held alive by their owners)
        self._finalizers: list[weakref.finalize] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self._note_input(t)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._note_output(t, str(func.overloadpacket.__name__))
        return out

    def _note_input(self, t: torch.Tensor) -> None:
        storage = _storage(t)
        if storage is None:
            return
        key = id(storage)
        if key not in self._sizes and key not in self._before:  # made before the mode: the baseline
            self._before.add(key)
            self.baseline += storage.nbytes()
            self._finalizers.append(weakref.finalize(storage, self._before.discard, key))

    def _note_output(self, t: torch.Tensor, op: str) -> None:
        storage = _storage(t)
        if storage is None:
            return
        key, size = id(storage), storage.nbytes()
        if key in self._before:
            return
        if key not in self._sizes:
            self._finalizers.append(weakref.finalize(storage, self._freed, key))
            self._sizes[key], self._ops[key] = 0, op
            if _in_host_block() or (self.device != "cpu" and storage.device.type == "cpu"):
                self._host.add(key)
        grown = size - self._sizes[key]  # an in-place resize of a storage made here
        if grown and key in self._host:
            self._sizes[key] = size
            self.host_live += grown
            self.host_peak = max(self.host_peak, self.host_live)
        elif grown:
            self._sizes[key] = size
            self.live += grown
            if self.explain:
                self._by_op[self._ops[key]] += grown
            if self.live > self.peak:
                self.peak = self.live
                if self.explain:
                    self.at_peak = {k: v for k, v in self._by_op.items() if v}

    def _freed(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        if key in self._host:
            self._host.discard(key)
            self.host_live -= size
            self._ops.pop(key, None)
            return
        self.live -= size
        if self.explain:
            self._by_op[self._ops.pop(key)] -= size
        else:
            self._ops.pop(key, None)

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        for finalizer in self._finalizers:  # storages freed later are no longer this block's business
            finalizer.detach()
        self._finalizers.clear()
        return result


def _storage(t: torch.Tensor):
    """The tensor's untyped storage, or None where it has none a byte count means (meta, sparse, wrapper tensors)."""
    if t.is_meta or t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def resident_peak_bytes() -> int:
    """The process's resident-set peak so far (``ru_maxrss``: KiB on Linux, bytes on macOS), in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def resident_bytes() -> int:
    """The process's resident set now (psutil where installed, else the peak so far)."""
    try:
        import psutil
    except ImportError:
        return resident_peak_bytes()
    return psutil.Process().memory_info().rss
