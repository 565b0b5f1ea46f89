"""``string`` (STRING, arXiv 2410.18745) against its paper: the position matrix written entry by entry, attention
computed from it pair by pair in float64 (nothing shared with the engines), and its bad input refused; the
package's ``ramp`` (the shift growing with the query) the same way and with a cache (every engine:
``test_attention_engines.py``)."""

from __future__ import annotations

import pytest
import torch
from conftest import error_text, tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassError
from pair_reference import layer_output_and_reference
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hf_rope_ext.types import registry

LENGTH = 24


def paper_positions(length: int, shift: int, local: int) -> torch.Tensor:
    """The paper's relative position matrix P[m][n] (m >= n): m - n below the shift S, m - n - S + W from it on."""
    rows = [[(m - n if m - n < shift else m - n - shift + local) if n <= m else 0 for n in range(length)]
            for m in range(length)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("shift, local", [(5, 2), (7, 0), (3, 2), (24, 4)])
def test_attention_equals_the_paper_position_matrix(shift, local, implementation):
    rope = {"rope_type": "string", "window": shift, "local_window": local}
    got, expected = layer_output_and_reference(rope, implementation, paper_positions(LENGTH, shift, local), seed=3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def ramp_positions(length: int, shift: int, local: int, ramp: int) -> torch.Tensor:
    """``ramp`` R: m - n below S; from S on m - n less a shift that grows with the query over R positions,
    floor((m - S + 1)(S - W) / R) until it is S - W."""
    rows = [[(m - n if m - n < shift else m - n - min((m - shift + 1) * (shift - local) // ramp, shift - local))
             if n <= m else 0 for n in range(length)] for m in range(length)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("shift, local, ramp", [(5, 2, 3), (7, 0, 7), (7, 1, 4), (7, 1, 20), (3, 2, 1), (12, 3, 9)])
def test_a_ramp_equals_its_position_matrix(shift, local, ramp, implementation):
    rope = {"rope_type": "string", "window": shift, "local_window": local, "ramp": ramp}
    got, expected = layer_output_and_reference(rope, implementation, ramp_positions(LENGTH, shift, local, ramp), 3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_ramp_of_s_minus_w_keeps_far_keys_far_until_the_shift_is_full():
    """With S = 8, W = 2 and R = 6 (an L0 of 8): no distance reaches S until m = 2S - W - 1 = 13, the first key stays
    at S - 1 meanwhile, and from m = 13 on the rows are the paper's; a ramp of 1 is the paper's form."""
    ramp, paper = ramp_positions(20, 8, 2, 6), paper_positions(20, 8, 2)
    assert ramp[:14].max() == 7 and ramp[8:14, 0].tolist() == [7] * 6 and paper[8, 0] == 2
    assert torch.equal(ramp[:8], paper[:8]) and torch.equal(ramp[13:], paper[13:]) and not torch.equal(ramp, paper)
    assert torch.equal(ramp_positions(20, 8, 2, 1), paper)


@pytest.mark.parametrize("value", ["yes", 1.5, -1])
def test_a_ramp_is_a_whole_number_of_positions(value):
    with pytest.raises((ValueError, StrictDataclassError), match="ramp"):
        tiny_config(rope_parameters={"rope_type": "string", "window": 8, "local_window": 2, "ramp": value})


def test_the_position_matrix_reuses_small_distances():
    p = paper_positions(12, 5, 2)
    assert p[4, 0] == 4 and p[5, 0] == 2 and p[11, 0] == 8 and p.max() == 8  # below S exact, then from W on


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["yarn", "ntk_by_parts"])
def test_frequencies_underneath_turn_the_shifted_distances(kind, implementation):
    """STRING on a frequency-level type: the paper's positions turned by that type's theta_i, its attention factor
    on the scores (squared, as on q and k), both from transformers' rope registry on a config of that type."""
    rope = {"rope_type": "string", "window": 7, "local_window": 2, "frequencies": kind, "frequency_factor": 2.0}
    config = tiny_config(rope_parameters={"rope_type": kind, "factor": 2.0, "rope_theta": 10000.0})
    theta, factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    got, expected = layer_output_and_reference(
        rope, implementation, paper_positions(LENGTH, 7, 2), seed=5, theta=theta.double(), gain=factor**2
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    plain, _ = layer_output_and_reference(rope | {"frequencies": "plain", "frequency_factor": None}, implementation,
                                          paper_positions(LENGTH, 7, 2), seed=5)  # fmt: skip
    assert not torch.allclose(plain, got, atol=1e-4)


@pytest.mark.parametrize("given", [{"frequencies": "yarn"}, {"frequency_factor": 2.0}])
def test_frequencies_and_their_factor_come_together(given):
    with pytest.raises((ValueError, StrictDataclassError), match="frequency_factor"):
        tiny_config(rope_parameters={"rope_type": "string", "window": 8, "local_window": 2, **given})


@pytest.mark.parametrize("ramp", [0, 7])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_frequencies_underneath_keep_the_cache_exact(implementation, ramp):
    """Greedy decoding past the shift with yarn underneath: each step's logits with the cache equal a recompute of
    the whole sequence without one (a ramp: the 5 steps m = 20..24 inside it, which ends at m = S - 1 + R = 19 + 7)."""
    rope = {"rope_type": "string", "window": 20 if ramp else 7, "local_window": 2, "ramp": ramp,
            "frequencies": "yarn", "frequency_factor": 2.0}  # fmt: skip
    model = tiny_model("llama", rope, attn_implementation=implementation)
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True)
        for step, scores in enumerate(out.scores):
            recompute = model(out.sequences[:, : 20 + step], use_cache=False).logits[:, -1]
            torch.testing.assert_close(scores, recompute, rtol=0, atol=1e-4)


@pytest.mark.parametrize("given", [{}, {"original_max_position_embeddings": 30}, {"window": 12}, {"local_window": 3}])
def test_left_out_window_and_local_window_take_the_authors_defaults(given):
    """S = L0 // 3 and W = 128 at most S // 2 (L0 = 64 here: 21 and 10) when a config leaves them out: the same
    logits as those values written out; an explicit value is kept (W's default follows the S in force)."""
    rope = {"rope_type": "string", **given}
    pretrained = given.get("original_max_position_embeddings", 64)
    shift = given.get("window", pretrained // 3)
    written = {"window": shift, "local_window": given.get("local_window", min(128, shift // 2))}
    ids = torch.randint(3, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = tiny_model("llama", rope, seed=4)(ids).logits
        expected = tiny_model("llama", {**rope, **written}, seed=4)(ids).logits
        shifted = tiny_model("llama", {**rope, **written, "local_window": written["local_window"] + 1}, seed=4)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch.allclose(got, shifted(ids).logits)  # the defaults matter past the shift


def test_the_authors_w_is_128_below_a_long_shift():
    config = tiny_config(max_position_embeddings=4096)
    params = registry.filled({"rope_type": "string"}, registry.get_method("string"), config)
    assert params["window"] == 1365 and params["local_window"] == 128


@pytest.mark.parametrize(
    "given, key", [({"window": 65}, "'window'"), ({"local_window": 21}, "'local_window'"), ({"window": 0}, "'window'")]
)
def test_an_invalid_value_given_is_still_refused(given, key):
    """Beside a default: S above L0 = 64, W not below the default S = 21, S below 1."""
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        tiny_config(rope_parameters={"rope_type": "string", **given})
    assert key in error_text(excinfo)
