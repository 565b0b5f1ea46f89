"""``accelerate launch --config_file examples/accelerate/deepspeed_zero3.yaml ... tests/deepspeed_on_cpu.py finetune
...`` with ``DS_ACCELERATOR=cpu``: the ``hf-rope-ext finetune`` command in each launched process, on accelerate's own
DeepSpeed ZeRO-3 path (``deepspeed.initialize``, DeepSpeed's CPU accelerator) over gloo. accelerate 1.15 starts
DeepSpeed on GPUs only: on a CPU its process state is MULTI_CPU, and an ``Accelerator(cpu=True)`` (what hf-rope-ext
builds on a CPU) never turns DEEPSPEED. This script, not the package, starts DeepSpeed's process group on gloo before
accelerate's (which then finds it up) and builds the Accelerator with ``cpu=False``, as a GPU launch would.

DeepSpeed's shared-memory all-reduce kernel (inference only) is not built.

Each process prints ``engine: <distributed_type>`` once its Accelerator exists, so a test can check that DeepSpeed
ran (a new accelerate could otherwise turn this into DDP unnoticed), and ``loaded: <bytes>``, the bytes of parameters
its base model holds as loaded (its partition under ``zero.Init``)."""

import os
import sys

import accelerate
import deepspeed
from accelerate import PartialState
from finetune_launch import report_engine, report_loaded

from hf_rope_ext.cli import main
from hf_rope_ext.train import prepare

# DeepSpeed's shared-memory all-reduce serves its inference all-reduce only (not training) and is compiled on first use
# (about a minute on 2 cores): left out, as on a machine without a C++ compiler
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
PartialState(cpu=True)  # accelerate's state on the process group DeepSpeed started


class Accelerator(accelerate.Accelerator):
    """accelerate's Accelerator as a GPU launch builds it (``cpu=False``); prepare.make_accelerator imports it from
    ``accelerate`` when it runs."""

    def __init__(self, *args, cpu=False, **kwargs):
        super().__init__(*args, cpu=False, **kwargs)


accelerate.Accelerator = Accelerator
report_engine(prepare, lambda accelerator: accelerator.distributed_type.value)
report_loaded(prepare)
code = main(sys.argv[1:])
# Once the run is over (adapter written, process group destroyed), a process has been seen to abort at interpreter
# exit, under load, with "terminate called without an active exception" from a native thread: the exit code, not the
# files, would then fail the test. The process leaves at once, without the interpreter's teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
