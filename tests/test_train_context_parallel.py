"""Context-parallel sharding of one sequence: each rank's tokens, PoSE/contiguous position ids and labels are the
whole sequence's, against torch's own load balancer, a slow loop and the whole-sequence loss (no GPU)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hf_rope_ext.train.context_parallel import shard_order, shard_sequence, shifted_labels
from hf_rope_ext.train.loss import causal_lm_loss
from hf_rope_ext.train.positions import position_ids, step_generator


def order_reference(length, cp, balance):
    """Slow loop: head-tail (rank r: chunk r then chunk 2cp-1-r of 2cp chunks), else consecutive pieces."""
    if not balance:
        piece = length // cp
        return [[r * piece + i for i in range(piece)] for r in range(cp)]
    chunk = length // (2 * cp)
    return [[c * chunk + i for c in (r, 2 * cp - 1 - r) for i in range(chunk)] for r in range(cp)]


@pytest.mark.parametrize("length,cp", [(8, 2), (24, 3), (64, 4), (12, 4), (10, 2), (16, 1)])
def test_order_matches_slow_loop(length, cp):
    balance = length % (2 * cp) == 0
    assert shard_order(length, cp).tolist() == order_reference(length, cp, balance)
    assert shard_order(length, cp, load_balance=False).tolist() == order_reference(length, cp, False)


@pytest.mark.parametrize("length,cp", [(8, 2), (24, 3), (64, 4)])
def test_order_matches_torch_head_tail_load_balancer(length, cp):
    """torch.distributed.tensor.experimental's balancer: its index order, cut in cp equal shards (Shard(seq_dim))."""
    balancer = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    indices = balancer._HeadTailLoadBalancer(length, cp, "cpu")._generate_indices()[0].long()
    assert torch.equal(shard_order(length, cp), torch.stack(indices.chunk(cp)))


@pytest.mark.parametrize("schedule", ["pose", "contiguous", "random"])
@pytest.mark.parametrize("cp", [2, 4])
def test_every_rank_holds_the_whole_sequences_positions_and_labels(schedule, cp):
    batch, window, span = 3, 32, 32 if schedule == "contiguous" else 256
    ids = torch.randint(3, 300, (batch, window), generator=torch.Generator().manual_seed(cp))
    positions = position_ids(schedule, batch, window, span, step_generator(0, cp), chunks=3)
    shards = [shard_sequence(ids, positions, cp, rank) for rank in range(cp)]
    seen = []
    for rank, shard in enumerate(shards):
        for local, token in enumerate(order_reference(window, cp, True)[rank]):
            assert torch.equal(shard["input_ids"][:, local], ids[:, token])
            assert torch.equal(shard["position_ids"][:, local], positions[:, token])
            successor = ids[:, token + 1] if token + 1 < window else torch.full((batch,), -100)
            assert torch.equal(shard["labels"][:, local], successor)  # shifted before sharding
            seen.append(token)
    assert sorted(seen) == list(range(window))  # every token on exactly one rank
    if schedule == "pose":  # the skips survive sharding: some rank sees a jump of more than one position
        assert any(bool((s["position_ids"].diff(dim=-1) > 1).any()) for s in shards)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shard_losses_add_up_to_the_whole_sequence_loss(cp):
    """Token losses summed over the ranks' shards == the whole sequence's next-token loss (fp32)."""
    batch, length, vocab = 2, 16, 50
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    logits = torch.randn(batch, length, vocab, generator=generator)
    positions = torch.arange(length).expand(batch, -1)
    total = torch.zeros(())
    for rank in range(cp):
        shard = shard_sequence(ids, positions, cp, rank)
        local = logits[:, shard_order(length, cp)[rank]]  # what this rank's model computes for its tokens
        total += F.cross_entropy(local.flatten(0, 1), shard["labels"].flatten(), ignore_index=-100, reduction="sum")
    whole = causal_lm_loss(logits, ids)
    assert torch.allclose(total / (batch * (length - 1)), whole, atol=1e-6)


def test_shifted_labels():
    ids = torch.tensor([[5, 6, 7], [1, 2, 3]])
    assert shifted_labels(ids).tolist() == [[6, 7, -100], [2, 3, -100]]


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: shard_order(10, 3), "length=10 must split evenly over cp_size=3"),
        (lambda: shard_order(12, 4, load_balance=True), "divisible by 2 x cp_size=8"),
        (lambda: shard_sequence(torch.zeros(1, 8), torch.zeros(1, 8), 2, 2), "cp_rank=2 must lie in"),
        (lambda: shard_sequence(torch.zeros(1, 8), torch.zeros(1, 6), 2, 0), "position_ids shape"),
    ],
)
def test_bad_sharding_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "rope_type, implementation, reason",
    [
        ("yarn", "sdpa", None),
        ("ntk_by_parts", "sdpa", None),
        ("default", "sdpa", None),
        ("self_extend", "sdpa", "scores attention in the package's own engine"),
        ("rerope", "sdpa", "scores attention in the package's own engine"),
        ("dynamic", "sdpa", "largest position id each rank sees"),
        ("longrope", "sdpa", "largest position id each rank sees"),
        ("dynamic_yarn", "sdpa", "largest position id each rank sees"),
        ("yarn", "flash_attention_2", "does not call F.scaled_dot_product_attention"),
    ],
)
def test_context_parallelism_is_allowed_only_where_torch_shards_the_whole_attention(rope_type, implementation, reason):
    from hf_rope_ext.train.context_parallel import context_parallel_obstacle

    found = context_parallel_obstacle(rope_type, implementation)
    assert found is None if reason is None else reason in found


class WithContextParallel:
    """The run's accelerator, as if its config asked for context parallelism over 2 ranks (no GPU here to run it)."""

    def __init__(self, accelerator):
        self._accelerator = accelerator
        self.parallelism_config = SimpleNamespace(cp_enabled=True, cp_size=2)

    def __getattr__(self, name):
        return getattr(self._accelerator, name)


def test_an_attention_level_type_under_context_parallelism_is_refused_before_training(tmp_path, monkeypatch):
    """Each rank would attend within its own shard and raise nothing: refused before any file is written, naming
    --sequence-parallel."""
    from hf_rope_ext.store.bundled import default_model_path
    from hf_rope_ext.train import FinetuneConfig, finetune, prepare

    stock = prepare.make_accelerator
    monkeypatch.setattr(prepare, "make_accelerator", lambda *args: WithContextParallel(stock(*args)))
    out = tmp_path / "run"
    cfg = FinetuneConfig(
        model=str(default_model_path()), out=str(out), rope_type="self_extend", length=1024, max_steps=1
    )
    with pytest.raises(
        ValueError, match=r"cp_size=2\) cannot train this run: rope_type='self_extend'.*--sequence-parallel"
    ):
        finetune(cfg)
    assert not out.exists() and not list(tmp_path.iterdir())
