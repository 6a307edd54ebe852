"""A reference for the belief scores: Table 2's point values computed directly from per-step
scores (the tests compare the scoring tables with it)."""

from __future__ import annotations

import numpy as np


def point_values(scores) -> dict[str, tuple[float, int]]:
    """Table 2's point values over per-step scores: metric -> (mean, steps behind it)."""
    gt = np.array([s.opt_gt for s in scores], dtype=bool)
    dec = np.array([s.opt_dec for s in scores], dtype=bool)
    regret = np.array([s.belief.qmdp_regret for s in scores], dtype=np.float64)
    ks = sorted({k for s in scores for k in s.opt_topk})
    columns = {
        "acc_gt": gt,
        "acc_dec": dec,
        "agreement": np.array([s.agreement for s in scores], dtype=bool),
        "optimal_on_both": gt & dec,
        "recovery": dec[~gt],
        "inverse_recovery": gt[~dec],
        **{f"acc_top{k}": np.array([s.opt_topk[k] for s in scores]) for k in ks},
        "expected_optimality": np.array([s.belief.expected_optimality for s in scores]),
        "qmdp_agreement": np.array([s.belief.action_is_qmdp_optimal for s in scores]),
        "qmdp_regret": regret[np.isfinite(regret)],
    }
    return {k: (float(np.mean(v)) if len(v) else float("nan"), len(v)) for k, v in columns.items()}
