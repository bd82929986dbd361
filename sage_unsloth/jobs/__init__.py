"""One job graph for every multi-step command of the kit: ``sage-unsloth sweep`` (sage_unsloth/jobs/sweep.py), the
demo lab (sage_unsloth/demo/run.py) and the notebooks' recipe (sage_unsloth/jobs/notebook.py) describe their work as
:class:`Step` s; one rule says which are done (:mod:`sage_unsloth.jobs.graph`: the input fingerprint recorded
beside the outputs, in one record folder ``<work>/steps/``) and one scheduler runs the rest on an executor
(:mod:`sage_unsloth.jobs.scheduler`).
"""

from sage_unsloth.jobs.graph import Step, StepRecord, fingerprint, is_done, plan, read_stamp
from sage_unsloth.jobs.scheduler import STAMP_DIR, Slot, run_steps, stamp_folder

__all__ = [
    "STAMP_DIR",
    "Slot",
    "Step",
    "StepRecord",
    "fingerprint",
    "is_done",
    "plan",
    "read_stamp",
    "run_steps",
    "stamp_folder",
]
