"""The four plug-in kinds and their one contract (docs/extending.md): the registry that resolves a config's node,
the call wrapper with its guard (guard.py: time budgets, signals, exits) and the trial call before loading,
the guides with the SAGE math they use (anchor.py), the advantage estimators, the policy terms and the KL
terms.
"""
