"""``util.memory_peak.LivePeak`` against allocations of known sizes: the peak, what is live at the end, the baseline of
storages made before the mode, views and in-place ops counted once, and autograd's backward seen."""

import torch

from hf_rope_ext.util.memory_peak import LivePeak, resident_bytes, resident_peak_bytes

MIB = 2**20


def test_peak_is_the_largest_sum_of_live_storages():
    with LivePeak() as live:
        a = torch.empty(MIB, dtype=torch.uint8)  # 1 MiB
        b = torch.zeros(2 * MIB, dtype=torch.uint8)  # 3 MiB live
        del a  # 2 MiB
        c = torch.ones(MIB // 4, dtype=torch.float32)  # 3 MiB live again
        view = c[10:].view(-1, 2)  # no new storage
        view.add_(1.0)  # in place: no new storage
        del b  # 1 MiB
        d = torch.empty(3 * MIB, dtype=torch.uint8)  # 4 MiB: the peak
        del d
    assert live.peak == 4 * MIB
    assert live.live == MIB and c.untyped_storage().nbytes() == MIB


def test_storages_from_before_are_the_baseline_not_the_peak():
    weight = torch.randn(256, 256)  # 256 KiB, made outside
    with LivePeak() as live:
        transposed = weight.t()  # a view of the weight: nothing new
        out = transposed @ torch.ones(256, 4)  # 4 KiB for the ones, 4 KiB for the product
        del transposed
    assert live.baseline == weight.untyped_storage().nbytes() == 256 * 1024
    assert live.peak == 2 * 4 * 256 * 4 and live.live == 4 * 256 * 4
    assert out.shape == (256, 4)


def test_backward_and_saved_tensors_are_seen():
    x = torch.randn(1024, requires_grad=True)  # 4 KiB, made outside
    with LivePeak(explain=True) as live:
        y = x.exp()  # 4 KiB, saved for backward
        z = y.sum()
        z.backward()  # x.grad: 4 KiB (and small temporaries)
        del y, z
    assert x.grad is not None
    assert live.peak >= 2 * 4096 and live.live >= 4096  # x.grad stays
    assert live.peak < 4 * 4096
    assert live.at_peak and sum(live.at_peak.values()) == live.peak


def test_resident_figures_are_positive():
    assert resident_peak_bytes() > 0 and resident_bytes() > 0
