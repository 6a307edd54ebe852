"""goalprobe.stats: the leaf room every other room may import (it imports none of them).

The records (:class:`Estimate`, :class:`Verdict`), the grid bootstrap and the rate intervals
honest at 0% and 100% (:mod:`.bootstrap`, :mod:`.rates`), the tests on them (:mod:`.inference`:
equivalence, Holm, exact and bootstrap p-values, detectable effects, seed pooling) and the
array-shape aliases that cross room boundaries (:mod:`.shapes`). It needs numpy and scipy
only (jaxtyping for the shapes), never torch nor any room of the library.
"""

from goalprobe.stats.bootstrap import (
    GridBootstrap,
    RandomState,
    as_generator,
    bootstrap_ci,
    grid_bootstrap_ratio,
    grid_ci,
    grid_codes,
    grid_mean,
    mean_ci,
    per_grid_sums,
    percentile_interval,
    safe_ratio,
)
from goalprobe.stats.estimate import VERDICT_ANSWERS, Estimate, Verdict, json_ready
from goalprobe.stats.inference import (
    EQUIVALENCE_VERDICTS,
    detectable_effect,
    equivalence_verdict,
    holm,
    interval_verdict,
    p_exact_rate,
    p_from_draws,
    p_from_interval,
    seed_pooled,
    undetectable_ceiling,
)
from goalprobe.stats.rates import (
    BOUNDED_AGREEMENT_METHOD,
    RATE_INTERVAL_METHOD,
    bounded_agreement_interval,
    clopper_pearson,
    cluster_rate_interval,
    intra_grid_correlation,
    is_count_rate,
    rate_difference_interval,
    wilson_interval,
)

__all__ = [
    "BOUNDED_AGREEMENT_METHOD",
    "EQUIVALENCE_VERDICTS",
    "RATE_INTERVAL_METHOD",
    "VERDICT_ANSWERS",
    "Estimate",
    "GridBootstrap",
    "RandomState",
    "Verdict",
    "as_generator",
    "bootstrap_ci",
    "bounded_agreement_interval",
    "clopper_pearson",
    "cluster_rate_interval",
    "detectable_effect",
    "undetectable_ceiling",
    "equivalence_verdict",
    "grid_bootstrap_ratio",
    "grid_ci",
    "grid_codes",
    "grid_mean",
    "holm",
    "interval_verdict",
    "intra_grid_correlation",
    "is_count_rate",
    "json_ready",
    "mean_ci",
    "p_exact_rate",
    "p_from_draws",
    "p_from_interval",
    "per_grid_sums",
    "percentile_interval",
    "rate_difference_interval",
    "safe_ratio",
    "seed_pooled",
    "wilson_interval",
]
