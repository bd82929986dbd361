"""The acceptance check of the GPU path: scripts/gpu_acceptance.sh on the first GPU, ``--cpu-rehearsal`` on a CPU and
in the test suite (run.py drives it; stage.py is one stage run; forced.py forces Unsloth's GPU-only trainer rewrites
onto a CPU; checks.py the verdicts; model.py the model; evidence.py what a run records). docs/verification.md."""
