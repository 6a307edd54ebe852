"""Activation patching with counterfactual grids (study, section 5.2 and appendix F).

Modules: :mod:`~goalprobe.probes.patching.counterfactuals` (pairs, no torch), :mod:`~goalprobe.probes.patching.sites`
(token positions), :mod:`~goalprobe.probes.patching.experiment` (the site x layers x direction sweep),
:mod:`~goalprobe.probes.patching.store_source` (source values from the activation store),
:mod:`~goalprobe.probes.patching.results` (rates, bootstrap CIs, tables) and
:mod:`~goalprobe.probes.patching.run` (the whole experiment in one call, used by ``goalprobe patch`` and
the demo). The patched forward passes themselves run through the residual-stream backends of
:mod:`goalprobe.activations.capture` (nnsight, TransformerLens, plain hooks).
"""
