"""The parallel scheduler's order: the ready stage with the most work after it first."""

from __future__ import annotations

import pytest

from goalprobe.stages import (
    CONTROL_STAGES,
    DEPENDS_ON,
    SECONDS_HINT,
    STAGES,
    work_after,
)


@pytest.mark.parametrize("stages", [STAGES, CONTROL_STAGES])
def test_work_after_is_the_longest_chain_of_readers(stages):
    work = work_after(stages)
    assert set(work) == set(stages) and set(SECONDS_HINT) == set(STAGES)
    for name in stages:
        readers = [r for r in stages if name in DEPENDS_ON[r] and r != "report"]
        expected = SECONDS_HINT[name] + max((work[r] for r in readers), default=0.0)
        assert work[name] == pytest.approx(expected)
    # the chain through the probes starts at the rollouts and outweighs any study of its own
    assert work["rollouts"] > work["probing"] > work["probes"] > work["scoring"]
    for alone in ("keys", "iso", "intention", "harm"):
        if alone in stages:
            assert work["rollouts"] > work[alone]


def test_a_stage_missing_from_the_book_does_not_lengthen_a_chain():
    without = tuple(n for n in STAGES if n not in ("probes", "scoring", "false_belief"))
    full, cut = work_after(STAGES), work_after(without)
    assert cut["activations"] < full["activations"]
    assert cut["rollouts"] < full["rollouts"]
