"""Stage 1, SFT: LoRA SFT of a base model into the paper's format (config, data, run; see run.py)."""
