"""The DeepSpeed config entries a LoRA run fills before ``accelerator.prepare`` where the config leaves them to
others (``auto``, or absent: accelerate's YAML path writes a config without them, and DeepSpeed's defaults apply).

- ``train_micro_batch_size_per_gpu``: accelerate reads it from a dataloader prepared with the model; the loop
  prepares its loaders apart (one per stage), so an ``auto`` value is filled with ``--batch-size``.
- ``zero_optimization.reduce_bucket_size``: under ZeRO-3 every process allocates a contiguous gradient bucket of this
  many elements in the gradients' dtype (DeepSpeed's default 5e8: 1.86 GiB in fp32, on each device, whatever trains).
  A LoRA run trains few elements: the bucket is sized to hold all of them (at most the default), so the gradients
  are reduced in one bucket and the rest of the default's bytes stay free for activations.
"""

from __future__ import annotations

DEEPSPEED_BUCKET = 500_000_000  # DeepSpeed's own reduce_bucket_size default (elements)


def fill_deepspeed_config(accelerator, model, batch_size: int) -> None:
    """Fill the entries above in ``accelerator``'s DeepSpeed config (nothing without DeepSpeed): ``model`` is the one
    about to be prepared, its trainable parameters (a ZeRO-3 one counted by ``ds_numel``) sizing the bucket."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    config = plugin.deepspeed_config
    if plugin.is_auto("train_micro_batch_size_per_gpu"):
        config["train_micro_batch_size_per_gpu"] = batch_size
    zero = config.setdefault("zero_optimization", {})
    if zero.get("reduce_bucket_size", "auto") == "auto":
        trained = sum(elements(p) for p in model.parameters() if p.requires_grad)
        zero["reduce_bucket_size"] = max(1, min(DEEPSPEED_BUCKET, trained))


def elements(parameter) -> int:
    """A parameter's elements: a ZeRO-3 partitioned one's whole count (``ds_numel``; its own tensor is empty)."""
    return parameter.ds_numel if hasattr(parameter, "ds_numel") else parameter.numel()
