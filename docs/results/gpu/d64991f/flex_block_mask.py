"""Compiled flex_attention on one decode step's query row (32 / 8 heads, head_dim 128, bf16, 32768 keys): the
device time of each kernel, given no block mask or a full one built outside the compiled call, per dynamic mode.

    python3 flex_block_mask.py   # on a CUDA machine; output: flex_block_mask.txt (this script as run, reformatted)
"""

import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile

d, bf = "cuda", torch.bfloat16
q = torch.randn(1, 32, 1, 128, device=d, dtype=bf)
k = torch.randn(1, 8, 32768, 128, device=d, dtype=bf)
v = torch.randn_like(k)
bm = create_block_mask(lambda b, h, a, j: j >= 0, 1, None, 1, 32768, device=d, BLOCK_SIZE=128)
CASES = [
    ("plain", {}),
    ("gqa", dict(enable_gqa=True)),
    ("gqa+lse", dict(enable_gqa=True, return_aux=AuxRequest(lse=True))),
    ("gqa+lse+bm", dict(enable_gqa=True, return_aux=AuxRequest(lse=True), block_mask=bm)),
]
for dyn in (None, True):
    torch._dynamo.reset()
    f = torch.compile(flex_attention, dynamic=dyn)
    for name, kw in CASES:
        qq = q if "gqa" in name else q[:, :8]
        try:
            for _ in range(3):
                f(qq, k, v, **kw)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                f(qq, k, v, **kw)
                torch.cuda.synchronize()
            events = p.key_averages()
            ks = [(e.key[:50], round(e.self_device_time_total)) for e in events if e.self_device_time_total > 0]
            print(dyn, name, ks, flush=True)
        except Exception as e:
            print(dyn, name, "ERR", repr(e)[:300], flush=True)
