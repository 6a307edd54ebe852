"""Activation patching with counterfactual grids (study, section 5.2 and appendix F).

Modules: :mod:`~probes.patching.counterfactuals` (pairs, no torch), :mod:`~probes.patching.sites`
(token positions), :mod:`~probes.patching.patch` (nnsight and TransformerLens backends),
:mod:`~probes.patching.experiment` (the site x layers x direction sweep),
:mod:`~probes.patching.store_source` (source values from the activation store) and
:mod:`~probes.patching.results` (rates, bootstrap CIs, tables).
"""
