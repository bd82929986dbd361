"""Loading the model stacks (TRL / Unsloth, the base and its LoRA) and the tiny offline model the tests and the
demo build.
"""
