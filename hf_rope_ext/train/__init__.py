"""Long-context LoRA fine-tuning with peft + accelerate + datasets (``hf-rope-ext finetune``).

``finetune(FinetuneConfig(...))`` runs a job end to end; ``load_adapter(path)`` loads its output on the base with
the extended rope parameters; ``bundle_adapter(path, base, out)`` writes the adapter and its extended base as one
folder that peft's ``AutoPeftModelForCausalLM`` loads right (``bundle``). Modules: ``data`` (text -> packed rows),
``positions`` (contiguous / PoSE / random position ids), ``model`` (base + target rope config, checks), ``lora``
(peft setup), ``loop`` (accelerate loop; ``batches``, ``checkpoints``, ``csv_log``, ``interrupt``, ``loss`` its
parts; ``run_folder`` where a run writes), ``evaluate`` (perplexity), ``config`` (the request and its checks),
``prepare`` (one job's state and outputs), ``finetune`` (the glue).
"""

from .bundle import bundle_adapter
from .config import FinetuneConfig, parse_stages
from .finetune import finetune
from .positions import SCHEDULES, position_ids
from .prepare import load_adapter

__all__ = ["bundle_adapter", "FinetuneConfig", "finetune", "load_adapter", "parse_stages", "position_ids", "SCHEDULES"]
