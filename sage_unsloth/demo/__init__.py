"""The offline CPU demo: a synthetic addition task with two labelled strategies, run through all four stages.

``python -m sage_unsloth.demo [--quick]`` (see :mod:`sage_unsloth.demo.run`); the task and its strategy
labeller are in :mod:`sage_unsloth.demo.task`, the data writers in :mod:`sage_unsloth.demo.data`.
"""
