"""The peft side: a LoRA adapter on chosen linear layers, optionally with the input embeddings and every norm
trained in full (LongLoRA: LoRA alone extends context poorly; trainable embeddings and norms close most of the gap).

Embeddings and norms go through peft's ``modules_to_save``, so they are saved in the adapter, restored by
``PeftModel.from_pretrained`` and folded in by ``merge_and_unload``.
"""

from __future__ import annotations

from ..util.quiet import peft_wrapping

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def norm_module_names(model) -> list[str]:
    """Last name component of every normalization module (class name containing 'Norm'), sorted, unique."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if "Norm" in type(module).__name__}
    return sorted(n for n in names if n)


def embedding_module_name(model) -> str:
    """Last name component of the input embedding module (``embed_tokens`` for Llama-like models)."""
    embeddings = model.get_input_embeddings()
    for name, module in model.named_modules():
        if module is embeddings:
            return name.rsplit(".", 1)[-1]
    raise ValueError(f"{type(model).__name__} exposes no input embedding module to train")


def check_targets(model, target_modules: list[str]) -> None:
    """Each target must name at least one ``nn.Linear`` of the model (peft's own message lists none of them)."""
    linear = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if type(module).__name__ == "Linear"}
    missing = [t for t in target_modules if t not in linear]
    if missing or not target_modules:
        raise ValueError(
            f"target_modules={list(target_modules)}: {missing or 'empty'} not found; linear layers: {sorted(linear)}"
        )


def lora_config(
    model, rank=8, alpha=16.0, dropout=0.0, target_modules=DEFAULT_TARGETS, train_embeddings=False, train_norms=False
):
    """A ``peft.LoraConfig`` for causal LM fine-tuning; bad values raise ValueError naming them."""
    from peft import LoraConfig

    if int(rank) < 1:
        raise ValueError(f"rank={rank} must be an integer >= 1")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout={dropout} must lie in [0, 1)")
    check_targets(model, list(target_modules))
    extra = ([embedding_module_name(model)] if train_embeddings else []) + (
        norm_module_names(model) if train_norms else []
    )
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=int(rank),
        lora_alpha=float(alpha),
        lora_dropout=float(dropout),
        target_modules=list(target_modules),
        modules_to_save=extra or None,
        # a model with tied input/output embeddings keeps them tied: the trained copy serves both
        ensure_weight_tying=bool(train_embeddings and getattr(model.config, "tie_word_embeddings", False)),
    )


def apply_lora(model, **options):
    """Wrap ``model`` in a ``PeftModel`` (LoRA weights in fp32 even on a bf16 base); options as :func:`lora_config`."""
    from peft import get_peft_model

    config = lora_config(model, **options)
    with peft_wrapping():  # peft 0.21 reads transformers' deprecated alias; only that warning is dropped
        return get_peft_model(model, config, autocast_adapter_dtype=True)
