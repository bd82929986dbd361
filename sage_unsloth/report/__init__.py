"""Stage 4: the report. Runs beside the paper's published numbers, bootstrap CIs over problems, paired
differences, pass@k curves, reasoning-pattern frequencies and (optionally) W&B logging / training curves.

Entry point: ``python -m sage_unsloth.report`` (``sage_unsloth.report.run.main``).
"""
