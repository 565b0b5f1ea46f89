"""``dual_chunk`` (Dual Chunk Attention, arXiv 2402.17463) against its authors' position rule: the relative
position of every (query, key) pair written entry by entry from HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``
(keys at n mod c; the query at m mod c, min(m mod c + c, chunk_size) or the successive query of a chunk's last
row, by chunk gap), attention computed from it pair by pair in float64, and bad input refused."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model
from pair_reference import layer_output_and_reference
from transformers import AutoModelForCausalLM

from hf_rope_ext import rope_parameters_for

LENGTH = 24


def paper_positions(length: int, size: int, local: int) -> torch.Tensor:
    """P[m][n] (m >= n): intra-chunk m - n; successive chunk min(m % c + c, size) - n % c; farther chunks
    qc[c - 1] - n % c, qc[i] = min(i + c, size) the successive query positions (c = size - local)."""
    c = size - local
    qc = [min(i + c, size) for i in range(c)]

    def relative(m: int, n: int) -> int:
        gap = m // c - n // c
        if gap == 0:
            return m - n
        return (qc[m % c] if gap == 1 else qc[c - 1]) - n % c

    rows = [[relative(m, n) if n <= m else 0 for n in range(length)] for m in range(length)]
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("size, local", [(7, 2), (7, 4), (6, 0), (10, 3), (30, 8)])
def test_attention_equals_the_authors_position_matrix(size, local, implementation):
    rope = {"rope_type": "dual_chunk", "chunk_size": size, "local_size": local}
    got, expected = layer_output_and_reference(rope, implementation, paper_positions(LENGTH, size, local), seed=4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_no_distance_exceeds_the_chunk_size_and_a_chunk_keeps_its_order():
    p = paper_positions(40, 7, 2)  # c = 5
    assert p.max() <= 7 and p.min() >= 0
    assert p[9, 5] == 4 and p[10, 9] == 5 - 4 and p[39, 0] == 7  # intra exact; successive; inter at size
    assert paper_positions(40, 7, 4)[39, 0] == 5  # c = 3: inter at 2c - 1 = 5 < chunk_size


@pytest.mark.parametrize("local", [0, 8, 31])
def test_a_chunk_size_just_below_l0_reads_l0_tokens_as_the_model_saved(local):
    """chunk_size = L0 - 1 and local_size < L0/2 (two chunks hold L0 tokens): the successive query
    min(m mod c + c, chunk_size) is m itself for every m <= chunk_size, so up to L0 tokens keep every exact distance
    (the model as saved) and L0 + 1 tokens do not."""
    plain = tiny_model(seed=5, attn_implementation="sdpa")  # L0 = max_position_embeddings = 64
    rope = {"rope_type": "dual_chunk", "chunk_size": 63, "local_size": local}
    chunked = tiny_model(rope_parameters=rope, seed=5, attn_implementation="sdpa")
    ids = torch.randint(3, 97, (1, 65), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        saved, read = plain(ids).logits, chunked(ids).logits
    torch.testing.assert_close(read[:, :64], saved[:, :64], rtol=0, atol=1e-5)
    assert (read[:, 64] - saved[:, 64]).abs().max() > 1e-4  # the 65th query: chunk 0's keys one position nearer


def test_a_qwen_config_declaring_dual_chunk_gives_the_logits_of_the_same_values_passed_explicitly(tmp_path):
    """A Qwen2.5-1M style config.json carries ``dual_chunk_attention_config``: ``rope_parameters_for(path,
    "dual_chunk")`` takes its values (loading without asking for the type stays as transformers has it)."""
    declared = {"chunk_size": 40, "local_size": 8, "original_max_position_embeddings": 64}
    model = tiny_model("qwen2", seed=3, dual_chunk_attention_config=declared)
    model.save_pretrained(tmp_path)
    taken = rope_parameters_for(tmp_path, "dual_chunk")
    assert {k: taken[k] for k in declared} == declared
    explicit = rope_parameters_for(tmp_path, "dual_chunk", chunk_size=40, local_size=8)
    ids = torch.randint(3, 97, (1, 100), generator=torch.Generator().manual_seed(0))
    logits = []
    for params in (taken, explicit, {**explicit, "chunk_size": 41}):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters=params, attn_implementation="sdpa")
        with torch.no_grad():
            logits.append(loaded(ids).logits)
    assert torch.equal(logits[0], logits[1]) and not torch.allclose(logits[0], logits[2])
    stock = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert stock.config.rope_parameters["rope_type"] == "default"
    with pytest.raises(ValueError, match=r"dual_chunk_attention_config=7: expected a dict"):
        rope_parameters_for(tiny_config("qwen2", dual_chunk_attention_config=7), "dual_chunk")
