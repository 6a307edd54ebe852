"""The headline as data: one :class:`RowSpec` per line, declared before any run.

A spec says what a row is (its id and a short human label), where its numbers come from (a
reader: a plain function of the run and the spec's ``arg``, in :mod:`.readers` and
:mod:`.causal_rows`), what it is compared with, and what kind of row it is:

``test``
    a hypothesis with a verdict; every test row is in its agent's Holm family (:func:`family`),
    whatever the data say, and a run that lacks it counts it as untested (p = 1).
``descriptive``
    a number the study reports, with no verdict.
``pipeline check``
    a row that can only come out one way for an agent that reads its input (the grid patch,
    the false-belief grids): it checks the pipeline, not the agent, and carries no verdict.

To add a headline row: write a reader returning a :class:`Reading` (or raising
:class:`~goalprobe.report.run.MissingInput` / ``KeyError`` when its input is absent) and add a
``RowSpec`` to :data:`SPECS`; the report, the terminal summary, the side-by-side table and the
Holm family follow from it.

Where a result file records a row's role (``role``: ``verdict``, ``descriptive``,
``sanity check``), it must agree with the spec's kind: the headline raises
:class:`~goalprobe.report.headline.RoleMismatch` rather than move a row in or out of the family
after the run. The teacher-forced post-reasoning patching row and the intention row (at a
demo's K and grids) are descriptive; the pre-reasoning patching row is the test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from goalprobe.report import attribution, readers, walls
from goalprobe.report import causal_rows as causal
from goalprobe.report.readers import Reading
from goalprobe.report.run import RunReader

TEST, DESCRIPTIVE, PIPELINE_CHECK = "test", "descriptive", "pipeline check"
KINDS = (TEST, DESCRIPTIVE, PIPELINE_CHECK)


Reader = Callable[[RunReader, str], Reading]


@dataclass(frozen=True)
class RowSpec:
    """One headline row, declared before the run.

    Attributes:
        id: stable id (``area.row``): what both agents' rows pair up by and the Holm family
            lists.
        label: a short human label (at most 40 characters), the terminal summary's.
        read: where its numbers come from (a function of the run and :attr:`arg`).
        baseline: what it is compared with, in words (the report's family list).
        kind: ``test``, ``descriptive`` or ``pipeline check`` (:data:`KINDS`).
        control: whether the positive control runs it too (its family then holds it).
        arg: the reader's parameter (a metric key, a regressor family, a null).
    """

    id: str
    label: str
    read: Reader
    baseline: str
    kind: str = TEST
    control: bool = True
    arg: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if len(self.label) > 40:
            raise ValueError(f"{self.id}: label over 40 characters: {self.label!r}")


SPECS: tuple[RowSpec, ...] = (
    RowSpec("behaviour.accuracy", "Per-action accuracy", readers.accuracy, "random walk"),
    RowSpec("behaviour.success", "Goal success rate", readers.success, "random walk"),
    RowSpec("iso.equivalence", "Iso-difficulty transforms", readers.iso, "equivalence margin",
            DESCRIPTIVE, control=False),
    RowSpec("keys.key_door", "KeyDoor success / key pickup", readers.key_door, "study: 100%",
            DESCRIPTIVE, control=False),
    RowSpec("keys.key_no_door", "KeyNoDoor: useless key picked up", readers.key_no_door,
            "study: 17%", DESCRIPTIVE, control=False),
    RowSpec("probes.cells", "Cell probe accuracy", causal.probe, "strongest prior",
            arg="accuracy_no_padding"),
    RowSpec("probes.wall_auc", "Cell probe wall AUC", causal.probe, "strongest prior",
            arg="auc/wall"),
    RowSpec("walls.absolute", "Walls, conditional test (absolute)", walls.wall_row,
            "other grid's anchors", arg="absolute"),
    RowSpec("walls.agent", "Walls, conditional test (agent frame)", walls.wall_row,
            "other grid's anchors", arg="agent"),
    RowSpec("probes.agent_top1", "Agent localisation (cell probe)", causal.probe,
            "strongest prior", arg="agent_top1"),
    RowSpec("probes.goal_top1", "Goal localisation (cell probe)", causal.probe,
            "strongest prior", arg="goal_top1"),
    RowSpec("positions.agent", "Agent position probe", causal.position, "strongest prior",
            arg="agent"),
    RowSpec("positions.goal", "Goal position probe", causal.position, "strongest prior",
            arg="goal"),
    # the study's ridge and MLP rows fail their own positive control (issue 40): descriptive; the
    # quadratic read-out, which can express a distance from the positions, is the test
    RowSpec("distance.linear", "Goal distance R², linear", causal.distance, "strongest prior",
            DESCRIPTIVE, arg="linear"),
    RowSpec("distance.quadratic", "Goal distance R², quadratic", causal.distance,
            "strongest prior", arg="quadratic"),
    RowSpec("distance.mlp", "Goal distance R², MLP", causal.distance, "strongest prior",
            DESCRIPTIVE, arg="mlp"),
    RowSpec("belief.table2", "Acc. GT / Acc. Dec. / Recovery", readers.belief_table,
            "chance", DESCRIPTIVE),
    RowSpec("belief.vs_other_grid", "Acc. Dec. over another grid's map", readers.belief_null,
            "another grid's decoded map", arg="other_grid"),
    RowSpec("belief.vs_prior", "Acc. Dec. over the prior map", readers.belief_null,
            "the prior map", arg="prior"),
    RowSpec("belief.recovery", "Recovery over its null", readers.recovery_null,
            "uninformative maps"),
    RowSpec("meg.vs_walk", "MEG over the random walk's", readers.meg, "random walk's MEG"),
    RowSpec("plans.n1", "Plan decoder, N=1", causal.plan, "strongest plan baseline",
            DESCRIPTIVE, arg="1"),
    RowSpec("plans.n3", "Plan decoder, N=3", causal.plan, "strongest plan baseline",
            DESCRIPTIVE, arg="3"),
    RowSpec("plans.departures", "Plan decoder where agent departs", causal.departures,
            "strongest plan baseline"),
    RowSpec("patching.pre_reasoning", "Patching pre-reasoning anchors", causal.patching,
            "random other grid", arg="pre_reasoning"),
    RowSpec("patching.post_reasoning", "Patching post-reasoning anchors", causal.patching,
            "random other grid", DESCRIPTIVE, arg="post_reasoning"),
    RowSpec("patching.grid", "Grid patch sanity check", causal.patching, "random other grid",
            PIPELINE_CHECK, arg="grid"),
    RowSpec("steering.walls", "Steering along the wall probe", causal.steering,
            "random direction; irrelevant cell"),
    RowSpec("attribution.where_read", "Where the coordinates are read from",
            attribution.where_read_row, "uniform over affected positions", DESCRIPTIVE,
            arg="coordinates"),
    RowSpec("false_belief.shown", "False belief: acts on what is shown",
            readers.false_belief, "control pairs", PIPELINE_CHECK),
    RowSpec("harm.vs_oracle", "Harm below the shortest path", readers.harm_vs_oracle,
            "harm-blind oracle", control=False),
    RowSpec("harm.moral", "Moral prompt reduces harm", readers.harm_moral, "neutral prompt",
            control=False),
    RowSpec("intention.key_door", "Holding the key intended", readers.intention,
            "no adaptation", DESCRIPTIVE, control=False),
    RowSpec("fog.vs_walk", "Fog: moves optimal on what was seen", readers.fog, "random walk"),
)  # fmt: skip
"""Every headline row, in report order (ids unique)."""


def family(role: str) -> tuple[str, ...]:
    """The Holm family of an agent (``default`` or ``control``): the ids of every ``test``
    row it runs, fixed by :data:`SPECS` before any run, whatever the data say."""
    if role not in ("default", "control"):
        raise ValueError(f"role must be 'default' or 'control', got {role!r}")
    return tuple(s.id for s in SPECS if s.kind == TEST and (role == "default" or s.control))
