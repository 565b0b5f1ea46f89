"""``--sequence-parallel N``: each row split over N CPU processes (gloo), attention by a Ulysses all-to-all around the
registered attention function. Every rope type trains as one process does (one launch looping over the types), and
gives one process's loss and adapter gradients over two and four processes on a model of 2 key-value heads (four
processes: each key-value head sent as two copies); a wrapper fed each rank's own position ids does not (the negative
control), the command itself under torchrun gives the one-process adapter, so do four processes of FSDP2 x sequence
parallelism, which resume exactly, and what the split cannot carry (a padded row included) is refused."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import byte_llama_config
from finetune_launch import (
    EVALUATION,
    L0,
    OPTIONS,
    ROOT,
    adapter,
    argv,
    assert_read_once,
    assert_same_figures,
    base_and_text,
    launch,
    log_rows,
    torchrun,
)
from sequence_parallel_types import TYPES

from hf_rope_ext.train import FinetuneConfig, finetune
from hf_rope_ext.train.batches import EpochSampler
from hf_rope_ext.train.checkpoints import checkpoint_step
from hf_rope_ext.train.config import check_numbers
from hf_rope_ext.train.context_parallel import shifted_labels
from hf_rope_ext.train.sequence_parallel import ONE, SequenceGroup, check_model, check_size, shard_loss

FSDP = ("--config_file", str(ROOT / "examples" / "accelerate" / "fsdp.yaml"))  # FSDP2, one decoder layer per unit
FSDP_PROGRAM = (str(Path(__file__).with_name("fsdp_on_cpu.py")), "finetune")
# fp32 bounds: the one-process and the split runs differ in summation order only (measured: losses within 1e-6,
# LoRA weights within 4e-6 after two AdamW steps of 1e-2, which move them by 2e-2)
LOSS_ATOL, WEIGHT_ATOL = 1e-5, 1e-4
# fp32 bound on one backward, relative to each tensor's largest entry (measured: 9e-7 at most, over two and four
# processes, every type and row)
GRADIENT_RTOL = 1e-5
PADDED = "attention_mask hides tokens of a row (padding, or packed sequences read from position ids); rows must be full"


def type_rows(*options: str) -> dict[str, dict]:
    done = torchrun([str(Path(__file__).with_name("sequence_parallel_types.py")), *options])
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["rope_type"]: row for row in rows}


def test_every_rope_type_trains_over_two_processes_as_on_one():
    rows = type_rows("--types", *TYPES)
    assert sorted(rows) == sorted(TYPES)
    for row in rows.values():
        assert row["loss"] < LOSS_ATOL and row["weights"] < WEIGHT_ATOL, row
        assert row["moved"] > 100 * WEIGHT_ATOL  # the bound is far below what the two steps move


@pytest.mark.parametrize("processes", [2, 4])
def test_every_rope_type_gives_one_processs_gradients_over_n_processes(processes):
    """8 query and 2 key-value heads, so four processes copy each key-value head twice; random LoRA B, so every
    adapter tensor has a gradient; the loss and each gradient before any optimizer step, per tensor within
    GRADIENT_RTOL of its largest entry, on contiguous, retrieval and PoSE rows; a padded row refused on every rank."""
    done = torchrun([str(Path(__file__).with_name("sequence_parallel_gradients.py"))], processes=processes)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    gaps = [row for row in rows if "rope_type" in row]
    assert sorted((row["rope_type"], row["batch"]) for row in gaps) == sorted(
        (t, b) for t in TYPES for b in ("contiguous", "retrieval", "pose")
    )
    for row in gaps:
        assert row["loss"] <= GRADIENT_RTOL and row["grads"] <= GRADIENT_RTOL and row["smallest"] > 0, row
    (refused,) = [row["refused"] for row in rows if "refused" in row]
    assert len(refused) == processes and all(PADDED in (message or "") for message in refused), refused


@pytest.mark.parametrize("processes", [2, 4])
def test_every_rope_type_is_evaluated_over_n_processes_as_on_one(processes):
    """The evaluation's split reading of a row: each token's loss within GRADIENT_RTOL of the full forward's, its
    argmax prediction the same wherever the reference's two best logits are apart."""
    done = torchrun([str(Path(__file__).with_name("split_reading_rows.py"))], processes=processes)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(row["rope_type"] for row in rows) == sorted(TYPES)
    for row in rows:
        assert row["loss"] <= GRADIENT_RTOL and row["predictions"] == 0 and row["clear"] > 0.9 * row["tokens"], row


def test_a_wrapper_fed_local_position_ids_is_caught():
    """The negative control: each rank's own ids in place of the gathered row's. Every attention-level type then
    trains another adapter, by far more than the equality bound."""
    attention_level = ["self_extend", "rerope", "leaky_rerope", "string", "dual_chunk", "xpos", "roper"]
    rows = type_rows("--local-positions", "--types", *attention_level)
    assert all(rows[t]["weights"] > 100 * WEIGHT_ATOL for t in attention_level), rows


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved 2-layer Llama (4 query, 2 key-value heads) with a byte-level tokenizer, and three text files."""
    return base_and_text(tmp_path_factory.mktemp("sp"))


RUN = dict(OPTIONS, rope_type="self_extend", length=4 * L0, window=48, max_steps=3, save_every=1)
RUN.update(grad_checkpointing=True, no_progress=True)
RUN.update(EVALUATION)  # before and after, split too


def log_losses(out: Path) -> list[float]:
    return [float(row[4]) for row in log_rows(out)[1:]]


@pytest.fixture(scope="module")
def one(setup):
    """One process reading two whole rows per micro-batch."""
    options = {k: v for k, v in RUN.items() if k != "no_progress"} | {"eval_lengths": [256, 512]}
    out = setup / "one"
    paths = dict(model=str(setup / "base"), data=[str(setup / "data")], out=str(out))
    return out, finetune(FinetuneConfig(**options, **paths, batch_size=2))


@pytest.fixture(scope="module")
def split(setup):
    """The command as the docs write it: ``torchrun --nproc_per_node 2 ... --sequence-parallel 2``."""
    out = setup / "split"
    torchrun(["-m", "hf_rope_ext", "finetune", *argv(setup, out, **RUN, batch_size=2, sequence_parallel=2)])
    return out


def assert_same_training(a: Path, b: Path) -> None:
    """The same adapter within the fp32 bound, the same per-step losses, the same before and after figures."""
    first, second = adapter(a), adapter(b)
    assert first.keys() == second.keys()
    assert max(float((first[k] - second[k]).abs().max()) for k in first) < WEIGHT_ATOL
    assert log_losses(a) == pytest.approx(log_losses(b), abs=LOSS_ATOL)
    assert_same_figures(a, b)


def test_the_command_over_two_processes_trains_the_one_process_adapter(one, split):
    assert_same_training(one[0], split)
    plan = json.loads((split / "checkpoints" / "step-000001" / "trainer_state.json").read_text())["plan"]
    assert plan["sequence_parallel"] == 2 and plan["processes"] == 1  # one data-parallel group of two


def test_fsdp2_by_sequence_parallel_on_four_processes_trains_and_resumes_as_one(setup, one):
    """Two data-parallel groups of two sequence-parallel processes, on accelerate's FSDP2 path
    (tests/fsdp_on_cpu.py), gradient checkpointing: one process's adapter and losses; resumed from step 1, the
    uninterrupted adapter bit for bit."""
    out, resumed = setup / "fsdp-split", setup / "fsdp-split-resumed"
    words = argv(setup, out, **RUN, batch_size=1, sequence_parallel=2)
    done = launch(words, processes=4, engine=FSDP, program=FSDP_PROGRAM)
    assert done.stdout.count("engine: FSDP fsdp2=True") == 4
    assert_read_once(done.stdout, 4)
    assert_same_training(one[0], out)
    checkpoint = out / "checkpoints" / "step-000001"
    words = argv(setup, resumed, **RUN, batch_size=1, sequence_parallel=2, resume_from=checkpoint)
    launch(words, processes=4, engine=FSDP, program=FSDP_PROGRAM)
    a, b = adapter(out), adapter(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert log_losses(resumed) == log_losses(out)[1:]


def test_resuming_under_another_split_is_refused(split):
    checkpoint = split / "checkpoints" / "step-000001"
    plan = json.loads((checkpoint / "trainer_state.json").read_text())["plan"]
    with pytest.raises(ValueError, match="sequence_parallel=2, this run 1"):
        checkpoint_step(checkpoint, {**plan, "sequence_parallel": 1})


def test_an_older_checkpoint_reads_as_unsplit(tmp_path):
    """Checkpoints written before the option hold no ``sequence_parallel``: they were unsplit."""
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 4, "plan": {"processes": 1}}))
    assert checkpoint_step(tmp_path, {"processes": 1, "sequence_parallel": 1}) == 4
    with pytest.raises(ValueError, match="sequence_parallel=1, this run 2"):
        checkpoint_step(tmp_path, {"processes": 1, "sequence_parallel": 2})


TWELVE_HEADS = {"hidden_size": 48, "num_attention_heads": 12, "num_key_value_heads": 4}


def sdpa_llama(**overrides):
    config = byte_llama_config(**overrides)
    config._attn_implementation = "sdpa"
    return config


@pytest.mark.parametrize(
    "overrides, size, lengths, message",
    [
        (
            {},
            3,
            [48],
            r"must divide the 4 query heads and divide or be a multiple of the 2 key-value heads.*\[1, 2, 4\]",
        ),
        (TWELVE_HEADS, 6, [48], r"12 query heads and divide or be a multiple of the 4 .*allowed: \[1, 2, 4, 12\]"),
        ({}, 2, [48, 33], "a training row of 33 tokens does not split into 2"),
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}, 2, [48], "sliding-window"),
        ({"sliding_window": 32}, 2, [32, 64], r"sliding-window layers \(sliding_window=32\) shorter than a training"),
    ],
)
def test_what_the_split_cannot_carry_is_refused(overrides, size, lengths, message):
    with pytest.raises(ValueError, match=message):
        check_model(sdpa_llama(**overrides), size, lengths)


@pytest.mark.parametrize(
    "heads, kv, allowed",
    [(8, 2, [1, 2, 4, 8]), (32, 8, [1, 2, 4, 8, 16, 32]), (9, 3, [1, 3, 9]), (12, 4, [1, 2, 4, 12]), (4, 1, [1, 2, 4])],
)
def test_n_divides_the_query_heads_and_divides_or_is_a_multiple_of_the_key_value_heads(heads, kv, allowed):
    from hf_rope_ext.attention.ulysses import allowed_sizes, kv_copies

    assert allowed_sizes(heads, kv) == allowed
    assert [kv_copies(kv, n) for n in allowed] == [max(n // kv, 1) for n in allowed]
    config = sdpa_llama(hidden_size=4 * heads, num_attention_heads=heads, num_key_value_heads=kv)
    for n in allowed:
        check_model(config, n, [48 * n])


def test_a_sliding_window_no_row_reaches_is_allowed():
    check_model(sdpa_llama(sliding_window=64), 2, [48, 64])
    check_model(sdpa_llama(sliding_window=16, use_sliding_window=False), 2, [48])  # Qwen2's switch: off


def test_an_implementation_that_needs_a_mask_is_refused():
    config = sdpa_llama()
    config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="not 'eager'"):
        check_model(config, 2, [48])
    check_model(config, 1, [48])  # no split: anything goes


@pytest.mark.parametrize("size, processes", [(2, 3), (0, 2), (4, 2)])
def test_a_split_that_does_not_divide_the_processes_is_refused(size, processes):
    with pytest.raises(ValueError, match=f"--sequence-parallel {size} must be >= 1 and divide"):
        check_size(size, processes)


def test_an_evaluation_row_that_does_not_split_is_refused(tmp_path):
    cfg = FinetuneConfig(model="m", out=str(tmp_path / "x"), rope_type="yarn", length=64, max_steps=1)
    cfg.sequence_parallel, cfg.eval_lengths = 2, [64, 97]
    with pytest.raises(ValueError, match="--eval-lengths \\[64, 97\\] with --sequence-parallel 2: .* 97 tokens do not"):
        check_numbers(cfg)
    cfg.eval_lengths = [64, 96]
    check_numbers(cfg)


def test_the_groups_ranks_read_the_same_rows():
    """Blocks of ``batch`` rows, each given to the ``repeats`` consecutive ranks of a group (split_batches cuts the
    global micro-batch in rank order); unsplit, the sampler is the permutation it always was."""
    sampler = EpochSampler(11, seed=3, block=2, groups=2, repeats=2)
    order = list(EpochSampler(11, seed=3))
    drawn = list(sampler)
    assert len(drawn) == len(sampler) == 2 * 8  # 11 rows: two global micro-batches of 2 groups x 2 rows
    for batch in range(2):
        ranks = [drawn[batch * 8 + 2 * r : batch * 8 + 2 * r + 2] for r in range(4)]
        assert ranks[0] == ranks[1] and ranks[2] == ranks[3]
        assert ranks[0] + ranks[2] == order[batch * 4 : batch * 4 + 4]


def test_a_groups_shard_losses_add_up_to_the_rows_loss(monkeypatch):
    """Labels shifted on the whole row, then sharded: each rank's N x (share of the summed loss) / the group's count,
    averaged over the N ranks (as DDP averages), is the mean next-token loss of the whole rows (one process's)."""
    from hf_rope_ext.train import sequence_parallel
    from hf_rope_ext.train.loss import causal_lm_loss

    generator = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(2, 12, 40, generator=generator), torch.randint(0, 40, (2, 12), generator=generator)
    ids[0, 5] = -100  # a token not scored
    labels = shifted_labels(ids)
    count = (labels != -100).sum().float()  # what the all-reduce over the group gives every rank
    monkeypatch.setattr(sequence_parallel, "valid_tokens", lambda shard, group: count)
    groups = [SequenceGroup(3, rank, None) for rank in range(3)]
    shares = [shard_loss(summed(g.shard(logits), g.shard(labels)), g.shard(labels), g) for g in groups]
    assert float(sum(shares) / 3) == pytest.approx(float(causal_lm_loss(logits, ids)), abs=1e-6)
    assert float(shard_loss(summed(logits, labels), labels, ONE)) == pytest.approx(float(causal_lm_loss(logits, ids)))


def summed(logits, labels):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")


@pytest.mark.parametrize(
    "heads, kwargs, message",
    [
        ((3, 1), {"position_ids": 0}, r"must divide the 3 query heads .* 1 key-value heads .*allowed: \[1, 3\]"),
        ((6, 3), {"position_ids": 0}, r"6 query heads .* 3 key-value heads .*allowed: \[1, 3, 6\]"),
        ((4, 2), {"position_ids": 0, "sliding_window": 15}, r"sliding_window=15\) shorter than the row \(16 tokens"),
        ((4, 2), {}, "got no position_ids to gather"),
    ],
)
def test_the_wrapper_refuses_a_call_it_cannot_carry(heads, kwargs, message):
    """The attention call's own check, for a model the command did not check (a caller of the package's pieces)."""
    from hf_rope_ext.attention.ulysses import check_shapes

    module = torch.nn.Module()
    module.config = sdpa_llama()
    query, key = torch.zeros(1, heads[0], 8, 4), torch.zeros(1, heads[1], 8, 4)  # 8 tokens a shard, 2 shards
    with pytest.raises(ValueError, match=message):
        check_shapes(module, query, key, 2, kwargs)
    check_shapes(module, torch.zeros(1, 4, 8, 4), torch.zeros(1, 2, 8, 4), 2, {"position_ids": 0, "sliding_window": 16})
    check_shapes(module, torch.zeros(1, 4, 8, 4), torch.zeros(1, 1, 8, 4), 2, {"position_ids": 0})  # 2 kv copies


def test_each_key_value_head_goes_out_as_adjacent_copies_whose_gradients_are_summed():
    """2 key-value heads, N = 4: heads [0, 0, 1, 1], so rank j receives kv head j // 2, the one its query heads
    (2j, 2j + 1 of 8) read; the backward gives each head the sum of its copies' gradients."""
    from hf_rope_ext.attention.ulysses import copied_heads

    x = torch.randn(2, 2, 3, 4, requires_grad=True)  # (batch, kv, shard, dim)
    copies = copied_heads(x, 4)
    assert [torch.equal(copies[:, j], x[:, [0, 0, 1, 1][j]]) for j in range(4)] == [True] * 4
    assert [h // 4 for h in range(8)] == [j // 2 for j in range(4) for _ in range(2)]  # q head h reads kv h // 4
    upstream = torch.randn(2, 4, 3, 4)
    copies.backward(upstream)
    assert torch.equal(x.grad, upstream[:, [0, 2]] + upstream[:, [1, 3]])
    assert copied_heads(x, 2) is x  # N divides the key-value heads: nothing copied


def shard_masks(monkeypatch, mask, positions) -> list:
    """The masks transformers hands the "sdpa" attention function of a 4-head Llama reading one shard: 8 tokens of
    a 16-token row, ``positions`` (2, 8), the 2-D ``mask`` (2, 8) or None."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import AttentionInterface

    seen, stock = [], AttentionInterface._global_mapping["sdpa"]

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append(attention_mask)
        return stock(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", spy)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(sdpa_llama(use_cache=False))
    model(input_ids=torch.randint(2, 300, (2, 8)), position_ids=positions, attention_mask=mask)
    return seen


SECOND_SHARD = torch.arange(8, 16).repeat(2, 1)


@pytest.mark.parametrize(
    "mask, positions, refused",
    [
        (torch.ones(2, 8, dtype=torch.long), SECOND_SHARD, False),  # what forward_loss passes
        (torch.tensor([[1] * 8, [1] * 5 + [0] * 3]), SECOND_SHARD, True),  # a row padded on the right
        (torch.tensor([[1] * 8, [0] * 3 + [1] * 5]), SECOND_SHARD, True),  # on the left
        (None, torch.tensor([[8, 9, 10, 20, 21, 22, 23, 40]] * 2), True),  # PoSE ids read as packed sequences
    ],
)
def test_a_mask_that_hides_part_of_a_row_is_refused(monkeypatch, mask, positions, refused):
    """The wrapper calls the function over the row without a mask: what transformers built for the shard passes only
    where it hides nothing a causal row attends."""
    from hf_rope_ext.attention.ulysses import check_mask

    masks = shard_masks(monkeypatch, mask, positions)
    assert len(masks) == 2  # one a layer
    for built in masks:
        if refused:
            with pytest.raises(ValueError, match=re.escape(PADDED)):
                check_mask(built, 2)
        else:
            check_mask(built, 2)


def test_a_full_mask_in_any_form_passes_and_a_padded_one_does_not():
    """flash-attention's (batch, shard) padding mask; a causal (batch, 1, q, k) mask, bool and float (0 attends)."""
    from hf_rope_ext.attention.ulysses import check_mask

    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)
    hidden = torch.finfo(torch.float32).min
    for mask in (torch.ones(2, 6, dtype=torch.long), causal, torch.zeros(2, 1, 6, 6).masked_fill(~causal, hidden)):
        check_mask(mask, 2)
    padded = causal.clone()
    padded[1, :, :, 0] = False  # row 1's first token hidden from every query
    for mask in (torch.tensor([[1] * 6, [0] + [1] * 5]), padded, torch.zeros(2, 1, 6, 6).masked_fill(~padded, hidden)):
        with pytest.raises(ValueError, match=re.escape(PADDED)):
            check_mask(mask, 2)
