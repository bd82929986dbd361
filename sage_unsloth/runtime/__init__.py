"""What keeps a run safe and recorded: complete and sane checkpoints, the finite-step guard, interrupts and the
process lifeline, folder locks, the training log, manifests and credentials, the output layout, the results
contract between eval and report, the W&B run contract (wandb_runs.py), and which stack runs (backend.py).
"""
