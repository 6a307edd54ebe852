"""Activation patching with counterfactual grids (study, section 5.2 and appendix F): pairs
(``counterfactuals``), token positions (``sites``), the sweep (``experiment``, ``patched_runs``,
with stored source values), rates, tables and verdicts (``results``) and the
whole experiment in one call (``run``); the patched forward passes run through
:mod:`goalprobe.activations.capture`."""
