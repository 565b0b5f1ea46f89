"""Long-context LoRA fine-tuning on tiny random models (CPU): loss falls, only adapter (and chosen) parameters learn,
save -> load -> merge keeps logits and rope parameters, resume is exact, bad input fails before anything is written."""

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from conftest import FAMILIES, save_byte_llama, tiny_model
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.eval.data import load_token_documents, long_enough
from hf_rope_ext.train import FinetuneConfig, finetune, load_adapter
from hf_rope_ext.train.lora import apply_lora, embedding_module_name, norm_module_names
from hf_rope_ext.train.model import extended_config
from hf_rope_ext.types import registry
from hf_rope_ext.types.registry import REQUIRED, default_parameters, get_method

L0 = 32  # the tiny base model's max_position_embeddings


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A saved 2-layer Llama with a byte-level tokenizer (ByT5: 384 ids)."""
    return str(save_byte_llama(tmp_path_factory.mktemp("base"), L0))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three text files of Python source (about 15k byte tokens)."""
    path = tmp_path_factory.mktemp("data")
    for module in (torch.nn.modules.linear, json.decoder, json.encoder):
        (path / f"{module.__name__}.txt").write_text(inspect.getsource(module)[:5000])
    return str(path)


def job(base, data, out, **overrides):
    options = dict(
        model=base,
        out=str(out),
        rope_type="ntk_by_parts",
        length=2 * L0,
        max_steps=2,
        data=[data],
        eval_data=[data],
        lr=1e-2,
        batch_size=2,
    )
    return FinetuneConfig(**{**options, **overrides})


def logits(model, length=2 * L0, seed=0):
    ids = torch.randint(3, 300, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def test_loss_falls(base, data, tmp_path):
    result = finetune(
        job(
            base,
            data,
            tmp_path / "out",
            max_steps=20,
            train_norms=True,
            train_embeddings=True,
            eval_lengths=[2 * L0],
            eval_rows=6,
            scheduler="constant",
            target_modules=("q_proj", "v_proj", "o_proj", "down_proj"),
        )
    )
    before, after = (r["perplexity"] for r in result["results"])
    assert after < 0.9 * before  # held-out rows of the same text: a random model starts near uniform (384 ids)
    losses = [r["loss"] for r in result["rows"]]
    assert sum(losses[-5:]) < sum(losses[:5])
    log = (tmp_path / "out" / "logs" / "train_log.csv").read_text().splitlines()
    assert log[0].startswith("step,stage,span,window,loss") and len(log) == 21
    assert (tmp_path / "out" / "README.md").read_text().count("(after)") == 1


def test_far_context_before_and_after_against_a_plain_loop(base, data, tmp_path):
    """Far-context loss: the last L0 - 1 tokens of each eval document's first 2 L0, read in one pass; baseline: the
    base model as saved reading each of them with exactly the L0 - 1 ... L0 - 16 tokens before it (stride 16)."""
    result = finetune(
        job(base, data, tmp_path / "out", eval_lengths=[L0 // 2, 2 * L0], eval_rows=2, eval_far_context=True)
    )
    short, before, _, after = result["results"]
    assert "far_context_loss" not in short and before["when"] == "before" and after["when"] == "after"
    docs = long_enough(load_token_documents(ByT5Tokenizer(), [data]), 2 * L0, 2)
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    extended = AutoModelForCausalLM.from_pretrained(base, config=AutoConfig.from_pretrained(tmp_path / "out")).eval()
    far, window = [], []
    with torch.no_grad():
        for doc in docs:
            ids = doc[: 2 * L0]
            logp = extended(input_ids=ids[None]).logits[0, :-1].log_softmax(-1)  # (2 L0 - 1, vocab)
            far += [-logp[t - 1, ids[t]] for t in range(L0 + 1, 2 * L0)]
            for t in range(L0 + 1, 2 * L0):  # token t is read by the window ending after the next multiple-of-16 end
                end = 2 * L0 - ((2 * L0 - 1 - t) // 16) * 16
                w = ids[end - L0 : end]
                window.append(-plain(input_ids=w[None]).logits[0, t - (end - L0) - 1].log_softmax(-1)[ids[t]])
    assert before["far_context_loss"] == pytest.approx(torch.stack(far).mean().item(), rel=1e-5)
    assert before["far_context_baseline"] == after["far_context_baseline"]
    assert before["far_context_baseline"] == pytest.approx(torch.stack(window).mean().item(), rel=1e-5)
    assert after["far_context_ratio"] == pytest.approx(
        math.exp(after["far_context_loss"] - before["far_context_baseline"])
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("embeddings,norms", [(False, False), (True, True)])
def test_only_adapter_and_chosen_parameters_learn(family, embeddings, norms):
    model = apply_lora(tiny_model(family), rank=4, train_embeddings=embeddings, train_norms=norms)
    ids = torch.randint(3, 90, (2, 24))
    model.train()(input_ids=ids, labels=ids).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert with_grad == trainable  # the frozen base gets no gradient at all
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in trainable if "lora_A" not in n)  # B starts at 0
    chosen = ([embedding_module_name(model)] if embeddings else []) + (norm_module_names(model) if norms else [])
    for name in trainable:
        assert "lora_" in name or ("modules_to_save" in name and any(f".{c}." in name for c in chosen)), name
    base = model.get_base_model()
    expected = {f"{n}.{ab}" for n, m in base.named_modules() for ab in ("lora_A", "lora_B") if hasattr(m, "lora_A")}
    assert {n.rsplit(".", 2)[0] for n in trainable if "lora_" in n} == {"base_model.model." + e for e in expected}
    assert any("modules_to_save" in n for n in trainable) == (embeddings or norms)


def test_save_load_merge_same_logits_and_rope_kept(base, data, tmp_path):
    out = tmp_path / "out"
    result = finetune(
        job(
            base,
            data,
            out,
            max_steps=3,
            train_norms=True,
            train_embeddings=True,
            merge=True,
            dropout=0.1,
            eval_lengths=[2 * L0],
            eval_rows=2,
        )
    )
    # the trained model in memory (its 'after' perplexity) is the one the saved adapter rebuilds
    from hf_rope_ext.eval import load_token_documents, truncated_perplexity

    documents = load_token_documents(ByT5Tokenizer(), [data])
    reloaded = truncated_perplexity(load_adapter(str(out)).eval(), documents, 2 * L0, 2, progress=False)
    assert reloaded["perplexity"] == pytest.approx(result["results"][-1]["perplexity"], rel=1e-5)
    expected = {
        "rope_type": "ntk_by_parts",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": L0,
    }
    for folder in (out, out / "merged"):
        saved = json.loads((folder / "config.json").read_text())
        assert saved["rope_parameters"] == expected and saved["max_position_embeddings"] == 2 * L0
    adapter = logits(load_adapter(str(out)))
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert torch.allclose(adapter, logits(merged), atol=1e-5, rtol=1e-5)
    # the property is not vacuous: the same merged weights under the base rope give other logits past L0
    plain = AutoModelForCausalLM.from_pretrained(
        out / "merged", rope_parameters={"rope_type": "default", "rope_theta": 1e4}
    )
    assert not torch.allclose(adapter[:, L0:], logits(plain)[:, L0:], atol=1e-3)
    assert not torch.allclose(adapter, logits(AutoModelForCausalLM.from_pretrained(base)), atol=1e-3)


def test_tied_embeddings_stay_tied_through_training_and_merge(data, tmp_path):
    save_byte_llama(tmp_path / "tied", L0, seed=1, num_hidden_layers=1, tie_word_embeddings=True)
    out = tmp_path / "out"
    finetune(job(str(tmp_path / "tied"), data, out, max_steps=2, train_embeddings=True, merge=True, lr=5e-2))
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert merged.config.tie_word_embeddings and torch.equal(merged.lm_head.weight, merged.model.embed_tokens.weight)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "tied")
    assert not torch.equal(merged.model.embed_tokens.weight, base.model.embed_tokens.weight)  # it did train
    assert torch.allclose(logits(load_adapter(str(out))), logits(merged), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "schedule,stages",
    [("pose", None), ("contiguous", None), ("random", [(L0, 1), (2 * L0, 3)])],  # the last resumes inside stage 2
)
def test_resume_reproduces_uninterrupted_run(base, data, tmp_path, schedule, stages):
    options = dict(
        max_steps=4,
        stages=stages,
        save_every=2,
        grad_accum=2,
        dropout=0.1,
        train_norms=True,
        position_schedule=schedule,
        window=L0 if schedule != "contiguous" else None,
        scheduler="linear",
        warmup_steps=1,
        lr=5e-3,
    )
    full = finetune(job(base, data, tmp_path / "full", **options))
    half = tmp_path / "full" / "checkpoints" / "step-000002"
    resumed = finetune(job(base, data, tmp_path / "resumed", resume_from=str(half), **options))
    a = load_file(tmp_path / "full" / "adapter_model.safetensors")
    b = load_file(tmp_path / "resumed" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in resumed["rows"]] == [r["loss"] for r in full["rows"][2:]]
    first = load_file(half / "model.safetensors")  # the checkpoint holds the trainable tensors only
    assert first and all("lora_" in k or "modules_to_save" in k for k in first)
    assert not all(torch.equal(first[k], a[k.replace(".default", "")]) for k in first if k.replace(".default", "") in a)


def test_resume_with_another_plan_is_refused(base, data, tmp_path):
    finetune(job(base, data, tmp_path / "a", max_steps=2))
    with pytest.raises(ValueError, match="batch_size=2, this run 1"):
        finetune(
            job(
                base,
                data,
                tmp_path / "b",
                max_steps=2,
                batch_size=1,
                resume_from=str(tmp_path / "a" / "checkpoints" / "step-000002"),
            )
        )
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="lacks trainable tensor .*norm"):
        finetune(
            job(
                base,
                data,
                tmp_path / "c",
                max_steps=2,
                train_norms=True,
                resume_from=str(tmp_path / "a" / "checkpoints" / "step-000002"),
            )
        )
    assert not (tmp_path / "c").exists()


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory, base):
    """The base with embeddings past fp16's range."""
    path = tmp_path_factory.mktemp("big")
    model = AutoModelForCausalLM.from_pretrained(base)
    model.get_input_embeddings().weight.data *= 1e7  # |w| ~ 2e5 > 65504
    model.save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def no_rope(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    config = AutoConfig.for_model("gpt2", vocab_size=384, n_embd=32, n_layer=1, n_head=2, n_positions=L0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    ByT5Tokenizer().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        ({"length": L0 // 2}, ValueError, "--length 16 is shorter than the model's max_position_embeddings=32"),
        ({"rope_type": "nope"}, KeyError, "rope_type='nope'"),
        ({"rope_type": "dynamic_yarn", "factor": 2.0}, ValueError, "takes no factor"),
        ({"factor": -2.0}, ValueError, "'factor'"),
        ({"rope_extra": {"beta_fast": 8, "gamma": 1}}, ValueError, "'gamma'"),
        ({"length": 40_000, "max_steps": 1}, ValueError, "fewer than one step needs"),
        ({"stages": [(L0, 1), (2 * L0, 1)], "max_steps": 3}, ValueError, "--max-steps 3"),
        ({"position_schedule": "pose", "window": 3 * L0}, ValueError, "--window 96"),
        ({"window": L0}, ValueError, "only for position schedules pose/random"),
        ({"target_modules": ("q_proj", "qkv")}, ValueError, r"\['qkv'\] not found"),
        ({"model": "overflowing", "precision": "fp16"}, ValueError, "use --precision bf16"),
        ({"model": "no_rope"}, ValueError, "does not fit model_type='gpt2'"),
        ({"batch_size": 0}, ValueError, "batch_size=0 must be an integer >= 1"),
        ({"scheduler": "triangle"}, ValueError, "scheduler='triangle' is not allowed"),
        ({"lr": 0.0}, ValueError, "lr=0.0 must be > 0"),
        ({"eval_far_context": True, "eval_lengths": [L0 // 2]}, ValueError, "--eval-far-context needs an"),
        ({"retrieval": 1.5}, ValueError, r"retrieval=1\.5"),
        ({"retrieval_keys": 99}, ValueError, "retrieval_keys=99"),
        ({"retrieval_same_kind": -0.5}, ValueError, r"retrieval_same_kind=-0\.5"),
        ({"retrieval": 0.5, "retrieval_keys": 7}, ValueError, "retrieval_keys=7: a row of 64 tokens is too short"),
    ],
)
def test_bad_input_fails_before_anything_is_written(base, data, tmp_path, request, overrides, error, match):
    if overrides.get("model") in ("overflowing", "no_rope"):
        overrides = {**overrides, "model": request.getfixturevalue(overrides["model"])}
    with pytest.raises(error, match=match):
        finetune(job(base, data, tmp_path / "out", **overrides))
    assert not (tmp_path / "out").exists()


def test_cli_runs_and_refuses_an_existing_folder(base, data, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "finetune",
        "--model",
        base,
        "--data",
        data,
        "--rope-type",
        "yarn",
        "--length",
        str(4 * L0),
        "--out",
        str(out),
        "--stages",
        f"{2 * L0}:1,{4 * L0}:1",
        "--rope-param",
        "beta_fast=16",
        "--batch-size",
        "1",
        "--eval-lengths",
        str(2 * L0),
        "--eval-rows",
        "1",
        "--eval-far-context",
    ]
    assert main(argv) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines() if "far-context ratio" in line]
    records = json.loads((out / "eval_results.json").read_text())
    assert [(p[0], float(p[-1])) for p in printed] == [(r["when"], round(r["far_context_ratio"], 4)) for r in records]
    saved = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert saved["rope_type"] == "yarn" and saved["factor"] == 4.0 and saved["beta_fast"] == 16
    assert [r.split(",")[2] for r in (out / "logs" / "train_log.csv").read_text().splitlines()[1:]] == ["64", "128"]
    stamp = (out / "adapter_model.safetensors").stat().st_mtime_ns
    assert main(argv) == 2 and "exists" in capsys.readouterr().err
    assert (out / "adapter_model.safetensors").stat().st_mtime_ns == stamp


GUESSED = ("factor", "original_max_position_embeddings")  # from the target length and the base's saved length


@pytest.mark.parametrize("rope_type", [*hf_rope_ext.available_rope_types(), "linear", "yarn", "dynamic", "default"])
def test_extended_config_for_every_type(base, rope_type):
    before = folder_bytes(base)
    required = (
        []
        if rope_type in ("linear", "yarn", "dynamic", "default")
        else [
            k
            for k, p in get_method(rope_type).params.items()
            if p.default is REQUIRED and k not in GUESSED and k not in default_parameters(rope_type, L0, 4.0)
        ]
    )
    if required:  # a required key the finetune command cannot guess must be named in the error
        with pytest.raises(KeyError, match=required[0]):
            extended_config(base, rope_type, 4 * L0)
        return
    config = extended_config(base, rope_type, 4 * L0)
    assert config.rope_parameters["rope_type"] == rope_type
    for key, value in default_parameters(rope_type, L0, 4.0).items():  # extend's values for the type's keys
        assert config.rope_parameters[key] == value, key
    assert config.max_position_embeddings == (L0 if rope_type == "dynamic" else 4 * L0)
    if "original_max_position_embeddings" in config.rope_parameters:
        assert config.rope_parameters["original_max_position_embeddings"] == L0
    model = AutoModelForCausalLM.from_pretrained(base, config=config)
    assert torch.isfinite(logits(model, 4 * L0)).all()
    assert folder_bytes(base) == before  # the base folder is left as it was: the extended config lives in memory


@pytest.mark.parametrize(
    ("rope_type", "length", "factor", "extra", "expected"),
    [
        ("self_extend", 4 * L0, None, {}, {"window": 8, "group_size": 9}),  # 8 + 120 / 9 <= 2/3 L0, not with 8
        ("self_extend", 2 * L0, None, {}, {"window": 8, "group_size": 5}),  # 8 + 56 / 5 <= 2/3 L0, not with 4
        ("dual_chunk", 4 * L0, None, {}, {"chunk_size": 24, "local_size": 2}),  # 3/4 and 1/16 of L0
        ("dual_chunk", 4 * L0, None, {"chunk_size": 20}, {"chunk_size": 20, "local_size": 2}),
        ("leaky_rerope", 4 * L0, None, {}, {"window": 8, "factor": 5.0}),  # 8 + (128 - 8) / 5 = 32
        ("leaky_rerope", 4 * L0, 3.0, {}, {"window": 8, "factor": 3.0}),  # --factor is the slope
        ("rerope", 4 * L0, None, {"window": 4}, {"window": 4}),
    ],
)
def test_finetune_fills_an_attention_types_keys_as_extend_and_the_user_overrides_them(
    base, rope_type, length, factor, extra, expected
):
    params = extended_config(base, rope_type, length, factor, extra).rope_parameters
    assert {key: params[key] for key in expected} == expected


def folder_bytes(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> content)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


REQUIRED_VALUES = {
    "window": 8,
    "group_size": 2,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "scale_base": 512.0,
    "value_rotary_factor": 1.0,
    "local_window": 2,
    "chunk_size": 12,
    "local_size": 4,
}


BUILTINS = ["linear", "yarn", "dynamic", "llama3", "longrope"]


def required_keys(rope_type, half_dim=4):
    """Values for the required keys the finetune command cannot derive (longrope: one factor per frequency)."""
    spec = (
        dict(registry.BUILTIN_TYPES[rope_type])
        if rope_type in BUILTINS
        else {k: p.default for k, p in get_method(rope_type).params.items()}
    )
    values = {**REQUIRED_VALUES, "short_factor": [1.0] * half_dim, "long_factor": [2.0] * half_dim}
    return {k: values[k] for k, v in spec.items() if v is REQUIRED and k in values}


@pytest.mark.parametrize("rope_type", [*hf_rope_ext.available_rope_types(), *BUILTINS])
def test_every_type_trains_saves_and_merges(base, data, tmp_path, rope_type):
    out = tmp_path / "out"
    finetune(
        job(
            base,
            data,
            out,
            rope_type=rope_type,
            rope_extra=required_keys(rope_type),
            max_steps=1,
            position_schedule="pose",
            window=L0,
            merge=True,
            lr=5e-2,
        )
    )
    saved = json.loads((out / "merged" / "config.json").read_text())["rope_parameters"]
    assert saved == json.loads((out / "config.json").read_text())["rope_parameters"]
    assert saved["rope_type"] == rope_type
    adapter = logits(load_adapter(str(out)))
    assert torch.allclose(adapter, logits(AutoModelForCausalLM.from_pretrained(out / "merged")), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope_type", [*hf_rope_ext.available_rope_types(), *BUILTINS])
def test_skipwise_positions_reach_every_type(rope_type):
    """The loop's forward (ids + PoSE position ids + all-ones mask) must see the skips: a relative method gives
    the same logits for shifted positions only when every distance is kept, and PoSE changes distances."""
    from hf_rope_ext.train.positions import position_ids, step_generator

    extra = {**required_keys(rope_type, half_dim=8), **({"factor": 2.0} if "factor" in _keys(rope_type) else {})}
    params = {"rope_type": rope_type, "rope_theta": 1e4, **extra}
    if "original_max_position_embeddings" in _keys(rope_type):
        params["original_max_position_embeddings"] = L0
    model = tiny_model("llama", params, attn_implementation="sdpa", max_position_embeddings=4 * L0)
    ids = torch.randint(3, 90, (2, L0))
    mask = torch.ones_like(ids)
    skipwise = position_ids("pose", 2, L0, 4 * L0, step_generator(0, 0))
    assert bool((skipwise.diff(dim=-1) > 1).any(dim=-1).all())  # every row has a skip
    with torch.no_grad():
        plain = model(input_ids=ids, position_ids=torch.arange(L0).expand(2, -1), attention_mask=mask).logits
        pose = model(input_ids=ids, position_ids=skipwise, attention_mask=mask).logits
        shifted = model(input_ids=ids, position_ids=torch.arange(L0).expand(2, -1) + 7, attention_mask=mask).logits
    assert not torch.allclose(plain, pose, atol=1e-4)
    assert torch.isfinite(pose).all() and torch.isfinite(shifted).all()


def _keys(rope_type):
    return set(registry.BUILTIN_TYPES[rope_type]) if rope_type in BUILTINS else set(get_method(rope_type).params)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = apply_lora(tiny_model("llama"), rank=4, train_norms=True)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(3, 90, (2, 40), generator=torch.Generator().manual_seed(0))
        model.train()(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][k], grads[1][k], atol=1e-6) for k in grads[0])


def test_apply_lora_emits_no_future_warning():
    """peft reads transformers' deprecated is_gradient_checkpointing: that one warning is dropped, nothing else."""
    import warnings

    model = tiny_model("llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(model, rank=2)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    if not hasattr(model, "is_activation_checkpointing"):  # the new name came with the deprecation
        pytest.skip(f"transformers {transformers.__version__} does not deprecate is_gradient_checkpointing")
    with pytest.warns(FutureWarning, match="is_gradient_checkpointing"):  # still raised outside apply_lora
        _ = model.is_gradient_checkpointing


def test_the_memory_techniques_train_and_evaluate_as_the_plain_run(base, data, tmp_path):
    """``--offload-checkpoints --tiled-mlp 16 --no-copies``: the adapter, the losses and the before/after evaluation
    (tiled too) of the plain run, up to the tiles' fp32 rounding."""
    options = dict(grad_checkpointing=True, eval_lengths=[L0, 2 * L0], eval_rows=2, train_norms=True)
    plain = finetune(job(base, data, tmp_path / "plain", **options))
    every = finetune(
        job(base, data, tmp_path / "every", offload_checkpoints=True, tiled_mlp=16, no_copies=True, **options)
    )
    a, b = (
        load_file(tmp_path / "plain" / "adapter_model.safetensors"),
        load_file(tmp_path / "every" / "adapter_model.safetensors"),
    )
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert [r["loss"] for r in every["rows"]] == pytest.approx([r["loss"] for r in plain["rows"]], rel=1e-6)
    assert len(every["results"]) == len(plain["results"]) == 4  # two lengths, before and after
    for x, y in zip(plain["results"], every["results"], strict=True):
        assert (x["when"], x["length"]) == (y["when"], y["length"]) and y["loss"] == pytest.approx(x["loss"], rel=1e-5)
    card = (tmp_path / "every" / "README.md").read_text()
    assert "tiled_mlp" in card and "offload_checkpoints" in card  # the card records the techniques


def test_offloading_without_checkpointing_is_refused(base, data, tmp_path):
    with pytest.raises(ValueError, match="--offload-checkpoints .* add --grad-checkpointing"):
        finetune(job(base, data, tmp_path / "out", offload_checkpoints=True))
    with pytest.raises(ValueError, match="tiled_mlp=-1 must be an integer >= 0"):
        finetune(job(base, data, tmp_path / "out", tiled_mlp=-1))
    assert not (tmp_path / "out").exists()
