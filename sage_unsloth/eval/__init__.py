"""Stage 3: pass@k evaluation (runs in its own process; never imports Unsloth)."""
