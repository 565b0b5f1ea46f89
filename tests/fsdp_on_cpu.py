"""``accelerate launch --use_fsdp --fsdp_version 2 ... tests/fsdp_on_cpu.py finetune ...``: the ``hf-rope-ext finetune``
command in each launched process, on accelerate's own FSDP2 path over gloo. accelerate 1.15 runs FSDP on GPUs only
(on a CPU its shared state says MULTI_CPU, and ``AcceleratorState`` then picks DDP); this script, not the package,
sets that shared state to MULTI_GPU after the CPU process group is up, so that ``AcceleratorState`` picks FSDP as it
does for a GPU user (``ACCELERATE_USE_FSDP=true``, ``FSDP_VERSION=2`` from the launcher).

Each process also prints ``loaded: <bytes>``, the bytes of real (not meta) parameters its base model holds before
``prepare``: with the CPU-RAM-efficient loading the accelerate config asks for, the main process alone reads the
checkpoint (``train.loading``), so a test can check that the others hold none.

Each process prints ``engine: <distributed_type> fsdp2=<bool>`` once its Accelerator exists, so a test can check that
FSDP2 ran (a new accelerate could otherwise turn this into DDP unnoticed)."""

import sys

from accelerate import PartialState
from accelerate.utils import DistributedType
from finetune_launch import report_engine, report_loaded

from hf_rope_ext.cli import main
from hf_rope_ext.train import prepare

PartialState(cpu=True)  # the gloo process group, as the package's launched_state() starts it
PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU  # what a GPU launch would report


report_loaded(prepare)
report_engine(prepare, lambda accelerator: f"{accelerator.distributed_type.value} fsdp2={accelerator.is_fsdp2}")
sys.exit(main(sys.argv[1:]))
