"""Tests of goalprobe.gridworld.metrics: hand-computed values, edge cases, properties."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats
from goalprobe.gridworld.core import Action, State
from goalprobe.gridworld.metrics import (
    ECE_BINS,
    INVALID,
    N_OUTCOMES,
    KeyAttraction,
    Stage,
    TrajectoryData,
    confidence_bins,
    expected_calibration_error,
    goal_success_rate,
    grid_accuracy,
    grid_metrics,
    group_by_grid,
    jaccard_similarity,
    key_attraction_bias,
    key_pickup_rate,
    manhattan_key_distance,
    metrics_by_grid,
    optimal_mask,
    paired_wilcoxon,
    policy_table,
    stage_accuracy,
    stage_of,
    trajectory_accuracy,
    trajectory_stage_accuracy,
)
from hypothesis import given, settings
from hypothesis import strategies as st

LN2, LN3 = math.log(2), math.log(3)
U, D, L, R = Action.UP, Action.DOWN, Action.LEFT, Action.RIGHT


def traj(states, actions, optimal, success=False, grid_id="g0") -> TrajectoryData:
    return TrajectoryData(
        grid_id=grid_id,
        states=states,
        actions=actions,
        optimal_sets=[frozenset(o) for o in optimal],
        success=success,
    )


@pytest.fixture
def hand_grid() -> list[TrajectoryData]:
    """Three trajectories on one grid; states are labels, the terminal states C, E are never acted in.

    t1: A -UP-> B -RIGHT-> C        pi*(A) = {UP}, pi*(B) = {DOWN, RIGHT}, success
    t2: A -DOWN-> D -UP-> E         pi*(D) = {UP}
    t3: A -UP-> B -invalid-> B
    """
    return [
        traj("ABC", [U, R], [{U}, {D, R}], success=True),
        traj("ADE", [D, U], [{U}, {U}]),
        traj("ABB", [U, None], [{U}, {D, R}]),
    ]


# ---------------------------------------------------------------- TrajectoryData validation


def test_trajectory_data_normalises_fields():
    t = traj(["A", "B"], [np.int64(2)], [[Action.LEFT, 3]], success=np.bool_(True))
    assert t.states == ("A", "B") and t.actions == (2,) and t.optimal_sets == (frozenset({2, 3}),)
    assert t.success is True and t.n_steps == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"states": "AB", "actions": [0, 1]}, "states must have len"),
        ({"optimal_sets": [frozenset({0}), frozenset({1})]}, "optimal_sets must have one entry"),
        ({"actions": [4]}, r"actions\[0\] must be an action"),
        ({"actions": [True]}, r"actions\[0\] must be an action"),
        ({"actions": ["UP"]}, r"actions\[0\] must be an action"),
        ({"optimal_sets": [frozenset()]}, r"optimal_sets\[0\] must be a non-empty set"),
        ({"optimal_sets": [frozenset({7})]}, r"optimal_sets\[0\]"),
        ({"optimal_sets": [5]}, r"optimal_sets\[0\] must be a set"),
        ({"states": [["A"], "B"]}, "state 0 is not hashable"),
        ({"success": 1}, "success must be a bool"),
    ],
)
def test_trajectory_data_rejects_bad_input(kwargs, message):
    fields = {
        "grid_id": "g7",
        "states": "AB",
        "actions": [0],
        "optimal_sets": [frozenset({0})],
        "success": False,
    }
    fields.update(kwargs)
    with pytest.raises(ValueError, match=message) as info:
        TrajectoryData(**fields)
    if "grid_id" not in kwargs:
        assert "g7" in str(info.value)


# ---------------------------------------------------------------- capability metrics


def test_accuracy_hand_computed(hand_grid):
    # t1: UP in {UP}, RIGHT in {DOWN, RIGHT} -> 2/2 = 1
    # t2: DOWN not in {UP}, UP in {UP}       -> 1/2
    # t3: UP in {UP}, invalid never optimal  -> 1/2
    assert [trajectory_accuracy(t) for t in hand_grid] == [1.0, 0.5, 0.5]
    np.testing.assert_array_equal(optimal_mask(hand_grid[2]), [True, False])
    # eq. 3 averages trajectory accuracies: (1 + 0.5 + 0.5) / 3 = 2/3
    assert grid_accuracy(hand_grid) == pytest.approx(2 / 3)


def test_grid_accuracy_is_mean_of_trajectories_not_pooled_steps():
    # t1: 3 of 4 optimal -> 0.75; t2: 0 of 1 -> 0. Eq. 3: (0.75 + 0) / 2 = 0.375 (pooled would be 3/5).
    t1 = traj("AAAAA", [U, U, U, D], [{U}] * 4)
    t2 = traj("AA", [D], [{U}])
    assert grid_accuracy([t1, t2]) == pytest.approx(0.375)


def test_goal_success_rate(hand_grid):
    # one success of three
    assert goal_success_rate(hand_grid) == pytest.approx(1 / 3)
    assert math.isnan(goal_success_rate([]))


# ---------------------------------------------------------------- uncertainty metrics


def test_policy_table_counts(hand_grid):
    table = policy_table(hand_grid)
    # visited (acted-in) states in order of first visit; terminal C and E are excluded
    assert table.states == ("A", "B", "D")
    np.testing.assert_array_equal(table.counts, [[2, 1, 0, 0, 0], [0, 0, 0, 1, 1], [1, 0, 0, 0, 0]])
    np.testing.assert_allclose(
        table.optimal, [[1, 0, 0, 0, 0], [0, 0.5, 0, 0.5, 0], [1, 0, 0, 0, 0]]
    )
    np.testing.assert_allclose(table.policy[0], [2 / 3, 1 / 3, 0, 0, 0])
    assert table.counts.shape == table.optimal.shape == (3, N_OUTCOMES) and INVALID == 4


def test_policy_entropy_hand_computed(hand_grid):
    # H(A) = H(2/3, 1/3) = ln 3 - (2/3) ln 2; H(B) = H(1/2 RIGHT, 1/2 invalid) = ln 2; H(D) = 0
    h_a = LN3 - 2 / 3 * LN2
    expected = (h_a + LN2 + 0.0) / 3
    assert grid_metrics(hand_grid).entropy == pytest.approx(expected)
    assert grid_metrics(hand_grid, base=2).entropy == pytest.approx(expected / LN2)


def test_policy_jsd_hand_computed(hand_grid):
    # A: p = (2/3, 1/3), q = (1, 0), m = (5/6, 1/6)
    #    KL(p||m) = 2/3 ln(4/5) + 1/3 ln 2,  KL(q||m) = ln(6/5)
    # B: p = (RIGHT 1/2, invalid 1/2), q = (DOWN 1/2, RIGHT 1/2), m = (1/4, 1/2, 1/4)
    #    KL(p||m) = 1/2 ln 2 = KL(q||m)  ->  JSD = 1/2 ln 2
    # D: p = q  ->  0
    jsd_a = (2 / 3 * math.log(4 / 5) + LN2 / 3 + math.log(6 / 5)) / 2
    expected = (jsd_a + LN2 / 2 + 0.0) / 3
    assert grid_metrics(hand_grid).jsd == pytest.approx(expected)
    np.testing.assert_allclose(policy_table(hand_grid).jsd(), [jsd_a, LN2 / 2, 0.0])


def test_grid_ece_hand_computed(hand_grid):
    # pairs (confidence pi_theta(a|s), correct):
    #   (A, UP) x2: 2/3, yes   -> bin 6: conf 2/3, acc 1
    #   (A, DOWN):  1/3, no    -> bin 3: conf 1/3, acc 0
    #   (B, RIGHT): 1/2, yes   \
    #   (B, inv.):  1/2, no    -> bin 5: conf 1/2, acc 1/2
    #   (D, UP):    1,   yes   -> bin 9: conf 1, acc 1
    # ECE = 2/6 * 1/3 + 1/6 * 1/3 + 0 + 0 = 1/6
    assert grid_metrics(hand_grid).ece == pytest.approx(1 / 6)


def test_grid_metrics_bundle(hand_grid):
    m = grid_metrics(hand_grid)
    assert (m.grid_id, m.n_trajectories, m.n_steps, m.n_visited_states) == ("g0", 3, 6, 3)
    assert m.success_rate == pytest.approx(1 / 3)
    assert m.accuracy == pytest.approx(grid_accuracy(hand_grid))
    assert m.entropy == pytest.approx(float(policy_table(hand_grid).entropy().mean()))
    assert m.jsd == pytest.approx(float(policy_table(hand_grid).jsd().mean()))
    assert m.ece == pytest.approx(1 / 6)


def test_metrics_by_grid_groups_and_single_grid_guard(hand_grid):
    other = traj("XY", [L], [{L}], success=True, grid_id="g1")
    mixed = [hand_grid[0], other, hand_grid[1], hand_grid[2]]
    assert list(group_by_grid(mixed)) == ["g0", "g1"]
    by_grid = metrics_by_grid(mixed)
    assert by_grid["g0"] == grid_metrics(hand_grid)
    assert by_grid["g1"].accuracy == 1.0 and by_grid["g1"].jsd == 0.0
    with pytest.raises(ValueError, match="2 grids"):
        grid_accuracy(mixed)


def test_inconsistent_optimal_sets_are_rejected():
    t1 = traj("AB", [U], [{U}])
    t2 = traj("AB", [U], [{D}])
    with pytest.raises(ValueError, match="state 'A'.*optimal set"):
        policy_table([t1, t2])


def test_all_optimal_deterministic_agent():
    # every step optimal with singleton optimal sets: accuracy 1, policy = pi*, so H = JSD = 0;
    # confidence 1 and correct everywhere -> ECE 0
    t = traj("ABCD", [R, R, D], [{R}, {R}, {D}], success=True)
    m = grid_metrics([t, t])
    assert (m.accuracy, m.entropy, m.jsd, m.ece, m.success_rate) == (1.0, 0.0, 0.0, 0.0, 1.0)


def test_empty_trajectory_gives_nan_not_error():
    t = traj("A", [], [])
    assert t.n_steps == 0
    assert math.isnan(trajectory_accuracy(t))
    m = grid_metrics([t])
    assert m.n_visited_states == 0 and m.success_rate == 0.0
    assert all(math.isnan(v) for v in (m.accuracy, m.entropy, m.jsd, m.ece))
    assert policy_table([]).entropy().size == 0 and policy_table([]).jsd().size == 0
    with pytest.raises(ValueError, match="at least one trajectory"):
        grid_metrics([])


def test_single_state_trajectory():
    # the agent bumps into a wall twice: one visited state, pi_theta = (UP: 1), pi* = (DOWN: 1)
    # -> accuracy 0, entropy 0, disjoint supports so JSD = ln 2, confidence 1 and wrong -> ECE 1
    t = traj("AAA", [U, U], [{D}, {D}])
    m = grid_metrics([t])
    assert m.n_visited_states == 1
    assert (m.accuracy, m.entropy, m.ece) == (0.0, 0.0, 1.0)
    assert m.jsd == pytest.approx(LN2)
    assert jaccard_similarity(t.states, t.states) == 1.0


# ---------------------------------------------------------------- ECE


def test_ece_hand_computed():
    # bin 0: {0.05 wrong}: |0 - 0.05| = 0.05, weight 1/5
    # bin 1: {0.15 right}: |1 - 0.15| = 0.85, weight 1/5
    # bin 9: {0.95, 1.0, 1.0}, 2 right: |2/3 - 2.95/3| = 0.95/3, weight 3/5
    # ECE = 0.9/5 + 0.19 = 0.37
    ece = expected_calibration_error([0.05, 0.15, 0.95, 1.0, 1.0], [False, True, True, False, True])
    assert ece == pytest.approx(0.37)


def test_ece_confidence_one_falls_in_last_bin():
    # same bin as 0.9: acc 1/2, conf 0.95 -> 0.45 (a separate bin for 1.0 would give (1 + 0.1)/2 = 0.55,
    # dropping it would give 0.1)
    assert expected_calibration_error([1.0, 0.9], [False, True]) == pytest.approx(0.45)


def test_ece_bins_are_left_closed():
    # 0.1 opens bin 1, away from 0.05 in bin 0: (|1 - 0.1| + |0 - 0.05|) / 2 = 0.475
    # (sharing a bin would give |0.5 - 0.075| = 0.425)
    assert expected_calibration_error([0.1, 0.05], [True, False]) == pytest.approx(0.475)
    # k/n confidences (what the empirical policy yields) land in bin floor(10 k / n), exactly
    for n in range(1, 200):
        k = np.arange(n + 1)
        np.testing.assert_array_equal(confidence_bins(k / n), np.minimum(10 * k // n, ECE_BINS - 1))
    np.testing.assert_array_equal(confidence_bins([0.0, 0.1, 0.999, 1.0], n_bins=4), [0, 0, 3, 3])


def test_ece_validation():
    assert math.isnan(expected_calibration_error([], []))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.2], [True])
    with pytest.raises(ValueError, match="equal length"):
        expected_calibration_error([0.5, 0.5], [True])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=40))
def test_ece_in_unit_interval_and_perfect_calibration_is_zero(pairs):
    conf, hit = zip(*pairs, strict=True)
    assert 0.0 <= expected_calibration_error(conf, hit) <= 1.0 + 1e-12
    # one bin: ECE = |accuracy - mean confidence|
    assert expected_calibration_error(conf, hit, n_bins=1) == pytest.approx(
        abs(np.mean(hit) - np.mean(conf))
    )


# ---------------------------------------------------------------- entropy / JSD properties

cells = st.sampled_from("ABCDEF")


@st.composite
def grid_trajectories(draw, allow_invalid=True):
    """Random trajectories on one grid, with one fixed optimal set per state."""
    optimal = {s: draw(st.sets(st.integers(0, 3), min_size=1)) for s in "ABCDEF"}
    action = st.one_of(st.integers(0, 3), st.none()) if allow_invalid else st.integers(0, 3)
    trajs = []
    for _ in range(draw(st.integers(1, 4))):
        states = draw(st.lists(cells, min_size=1, max_size=8))
        actions = [draw(action) for _ in states[1:]]
        trajs.append(
            traj(states, actions, [optimal[s] for s in states[:-1]], success=draw(st.booleans()))
        )
    return trajs


@settings(max_examples=60, deadline=None)
@given(grid_trajectories())
def test_grid_metric_bounds(trajs):
    m = grid_metrics(trajs)
    if m.n_steps == 0:
        return
    assert 0.0 <= m.entropy <= math.log(N_OUTCOMES) + 1e-12
    assert 0.0 <= m.jsd <= LN2
    assert 0.0 <= m.ece <= 1.0 + 1e-12
    assert 0.0 <= m.success_rate <= 1.0
    if not math.isnan(m.accuracy):
        assert 0.0 <= m.accuracy <= 1.0


@settings(max_examples=40, deadline=None)
@given(grid_trajectories(allow_invalid=False))
def test_entropy_at_most_ln4_without_invalid_steps(trajs):
    h = policy_table(trajs).entropy()
    assert h.size == 0 or h.mean() <= math.log(4) + 1e-12


# ---------------------------------------------------------------- Jaccard


def test_jaccard_hand_computed():
    # {A, B, C} & {A, C, D, E} = {A, C}; union has 5 states -> 2/5 (duplicates ignored)
    assert jaccard_similarity("ABCA", "ACDEE") == pytest.approx(0.4)
    assert jaccard_similarity("AB", "CD") == 0.0
    assert math.isnan(jaccard_similarity([], []))
    # with-key vs without-key trajectory compared on agent cells
    with_key = [State((1, 1)), State((1, 2), has_key=True)]
    no_key = [State((1, 1)), State((1, 2))]
    assert jaccard_similarity(with_key, no_key) == pytest.approx(1 / 3)
    assert jaccard_similarity([s.agent for s in with_key], [s.agent for s in no_key]) == 1.0


@settings(max_examples=100, deadline=None)
@given(st.lists(cells, min_size=1), st.lists(cells, min_size=1))
def test_jaccard_bounded_and_symmetric(a, b):
    j = jaccard_similarity(a, b)
    assert 0.0 <= j <= 1.0
    assert j == jaccard_similarity(b, a)
    assert jaccard_similarity(a, a) == 1.0


# ---------------------------------------------------------------- Wilcoxon / rank-biserial

# Darwin's Zea mays data (cross- minus self-fertilised heights), the example of scipy's docs
DARWIN = np.array([6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75], dtype=float)


def test_wilcoxon_known_example_matches_scipy():
    # |d| ranks 1..15; the negative differences -48 and -67 have ranks 10 and 14
    # -> W- = 24, W+ = 120 - 24 = 96, rank-biserial = (96 - 24) / 120 = 0.6
    res = paired_wilcoxon(np.zeros_like(DARWIN), DARWIN)
    ref = scipy.stats.wilcoxon(DARWIN)
    assert res.statistic == 24.0  # W- (two-sided: min(W+, W-))
    assert res.statistic == ref.statistic
    assert res.p_value == pytest.approx(ref.pvalue)
    assert res.p_value == pytest.approx(0.041259765625)  # exact null distribution, n = 15
    assert res.rank_biserial == pytest.approx(0.6)
    assert (res.n_pairs, res.n_nonzero) == (15, 15)
    # one-sided alternative is passed through
    assert paired_wilcoxon(
        np.zeros_like(DARWIN), DARWIN, alternative="greater"
    ).p_value == pytest.approx(scipy.stats.wilcoxon(DARWIN, alternative="greater").pvalue)


def test_rank_biserial_hand_case_sign_and_size():
    base = np.array([0.5, 0.5, 0.5, 0.5])
    # d = transformed - base = (-0.1, 0.2, 0.3, 0): zero dropped; ranks of |d| = 1, 2, 3
    # W+ = 2 + 3 = 5, W- = 1 -> r = (5 - 1) / 6 = 2/3, transformed tends larger
    transformed = np.array([0.4, 0.7, 0.8, 0.5])
    res = paired_wilcoxon(base, transformed)
    assert res.rank_biserial == pytest.approx(2 / 3)
    assert (res.n_pairs, res.n_nonzero) == (4, 3)
    swapped = paired_wilcoxon(transformed, base)
    assert swapped.rank_biserial == pytest.approx(-2 / 3)
    assert swapped.p_value == pytest.approx(res.p_value)
    # tied |d|: ranks 1.5, 1.5, 3 -> W+ = 3 = W- -> r = 0
    assert paired_wilcoxon([0, 0, 0], [1, 1, -2]).rank_biserial == 0.0


def test_wilcoxon_all_zero_differences_is_a_clear_result():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = paired_wilcoxon([0.2, 0.7, 1.0], [0.2, 0.7, 1.0])
    assert (res.p_value, res.rank_biserial, res.n_nonzero, res.n_pairs) == (
        1.0,
        0.0,
        0,
        3,
    )


def test_wilcoxon_validation():
    with pytest.raises(ValueError, match="equal length"):
        paired_wilcoxon([1, 2], [1])
    with pytest.raises(ValueError, match="at least one pair"):
        paired_wilcoxon([], [])
    with pytest.raises(ValueError, match="finite"):
        paired_wilcoxon([1.0, math.nan], [1.0, 2.0])


# ---------------------------------------------------------------- key metrics

KEY, DOOR = (1, 3), (3, 3)


def key_door_trajectories() -> list[TrajectoryData]:
    """Hand-played KeyDoor episodes; key at (1, 3), door at (3, 3), goal at (4, 3).

    t1: to key: RIGHT ok, DOWN wrong (away), UP ok, RIGHT ok (picks up key)
        to door: DOWN ok, DOWN ok (opens door)
        to goal: LEFT wrong (wall bump, has key), DOWN ok -> goal
    t2: to key only: DOWN wrong (away), RIGHT wrong (towards), invalid, DOWN wrong (wall bump)
    """

    def s(r, c, has_key=False, door_open=False):
        return State((r, c), has_key=has_key, door_open=door_open)

    t1 = traj(
        [s(1, 1), s(1, 2), s(2, 2), s(1, 2), s(1, 3, True), s(2, 3, True), s(3, 3, True, True),
         s(3, 3, True, True), s(4, 3, True, True)],
        [R, D, U, R, D, D, L, D],
        [{R}, {R}, {U}, {R}, {D}, {D}, {D}, {D}],
        success=True,
    )  # fmt: skip
    t2 = traj(
        [s(1, 1), s(2, 1), s(2, 2), s(2, 2), s(2, 2)],
        [D, R, None, D],
        [{R}, {U}, {U}, {U}],
    )
    return [t1, t2]


def test_stage_of():
    assert stage_of(State((0, 0))) is Stage.TO_KEY
    assert stage_of(State((0, 0), has_key=True)) is Stage.TO_DOOR
    assert stage_of(State((0, 0), has_key=True, door_open=True)) is Stage.TO_GOAL
    # a grid without a door starts with door_open=True: every state is in the goal stage
    assert stage_of(State((0, 0), door_open=True)) is Stage.TO_GOAL
    with pytest.raises(ValueError, match="has_key"):
        stage_of("A")


def test_stage_accuracy_hand_computed():
    t1, t2 = key_door_trajectories()
    a1 = trajectory_stage_accuracy(t1)
    # to key: steps 0-3 [1, 0, 1, 1] -> 3/4; to door: steps 4-5 [1, 1] -> 1; to goal: steps 6-7 [0, 1] -> 1/2
    assert (a1.to_key, a1.to_door, a1.to_goal) == (0.75, 1.0, 0.5)
    assert (a1.n_to_key, a1.n_to_door, a1.n_to_goal) == (4, 2, 2)
    a2 = trajectory_stage_accuracy(t2)
    assert a2.to_key == 0.0 and math.isnan(a2.to_door) and math.isnan(a2.to_goal)
    # over both: to key (0.75 + 0) / 2; door and goal only from t1
    both = stage_accuracy([t1, t2])
    assert both[Stage.TO_KEY] == pytest.approx(0.375) and both.n_to_key == 2
    assert (both.to_door, both.n_to_door, both.to_goal, both.n_to_goal) == (1.0, 1, 0.5, 1)


def test_key_no_door_has_only_goal_stage():
    t = traj([State((1, 1), door_open=True), State((1, 2), door_open=True)], [R], [{R}])
    acc = stage_accuracy([t])
    assert math.isnan(acc.to_key) and math.isnan(acc.to_door) and acc.to_goal == 1.0


def test_key_pickup_rate():
    t1, t2 = key_door_trajectories()
    assert key_pickup_rate([t1, t2]) == 0.5
    assert key_pickup_rate([t1]) == 1.0 and math.isnan(key_pickup_rate([]))
    with pytest.raises(ValueError, match="has_key"):
        key_pickup_rate([traj("AB", [U], [{U}])])


def test_key_attraction_bias_hand_computed():
    t1, t2 = key_door_trajectories()
    # Manhattan distance to the key (1, 3), non-optimal valid steps without the key:
    #   t1 step 1: (1,2) -> (2,2): 1 -> 2 away         (t1 step 6 holds the key: not counted)
    #   t2 step 0: (1,1) -> (2,1): 2 -> 3 away
    #   t2 step 1: (2,1) -> (2,2): 3 -> 2 towards
    #   t2 step 3: (2,2) -> (2,2): wall bump, 2 -> 2 not towards   (t2 step 2 invalid: not counted)
    # -> 1 of 4
    got = key_attraction_bias([t1, t2], manhattan_key_distance(KEY))
    assert got == KeyAttraction(n_non_optimal=4, n_towards=1, bias=0.25)
    # a BFS-style distance map keyed by the agent cell works the same way
    bfs = {(1, 1): 2, (1, 2): 1, (2, 1): 3, (2, 2): 2}
    assert key_attraction_bias([t2], lambda s: bfs[s.agent]) == KeyAttraction(3, 1, 1 / 3)
    assert math.isnan(key_attraction_bias([], manhattan_key_distance(KEY)).bias)


# ---------------------------------------------------------------- with the real grid world


def _rollout_trajectory(grid, policy, actions, grid_id):
    """A TrajectoryData from executing ``actions`` (None = invalid, agent stays) with real dynamics."""
    from goalprobe.gridworld.dynamics import initial_state, is_success, step

    state = initial_state(grid)
    states, taken, optimal = [state], [], []
    for action in actions:
        if is_success(grid, state):
            break
        optimal.append(policy.optimal_actions(state))
        taken.append(action)
        state = state if action is None else step(grid, state, action)
        states.append(state)
    return TrajectoryData(
        grid_id=grid_id,
        states=states,
        actions=taken,
        optimal_sets=optimal,
        success=is_success(grid, state),
    )


def test_noisy_agent_on_generated_grids_agrees_with_bfs_distances():
    from goalprobe.gridworld.dynamics import step
    from goalprobe.gridworld.generator import generate_grid
    from goalprobe.gridworld.optimal import solve

    rng = np.random.default_rng(0)
    for g in range(4):
        grid = generate_grid(7, 0.4, rng, grid_id=f"grid{g}")
        policy = solve(grid)
        trajs = []
        for _ in range(5):
            actions = [
                None if rng.random() < 0.1 else int(rng.integers(4)) for _ in range(policy.horizon)
            ]
            trajs.append(_rollout_trajectory(grid, policy, actions, grid.grid_id))
        # independent check of accuracy: an action is optimal iff it lowers the BFS distance by one
        for t in trajs:
            by_distance = [
                a is not None and policy.distance(step(grid, s, a)) == policy.distance(s) - 1
                for s, a in zip(t.states[:-1], t.actions, strict=True)
            ]
            assert trajectory_accuracy(t) == pytest.approx(np.mean(by_distance))
            assert t.success == (t.states[-1].agent == grid.goal)
        m = grid_metrics(trajs)
        assert 0.0 <= m.jsd <= LN2 and 0.0 <= m.entropy <= math.log(N_OUTCOMES)
        # a perfect agent (random tie-breaks) is always right and succeeds
        perfect = []
        for _ in range(5):
            states, actions = policy.optimal_trajectory(rng)
            opt = [policy.optimal_actions(s) for s in states[:-1]]
            perfect.append(
                TrajectoryData(
                    grid_id=grid.grid_id,
                    states=states,
                    actions=actions,
                    optimal_sets=opt,
                    success=True,
                )
            )
        pm = grid_metrics(perfect)
        assert (pm.accuracy, pm.success_rate) == (1.0, 1.0)
        # its confidence never exceeds its accuracy (1), so ECE = 1 - mean confidence over steps
        table = policy_table(perfect)
        conf = [
            table.policy[table.states.index(s), a]
            for t in perfect
            for s, a in zip(t.states[:-1], t.actions, strict=True)
        ]
        assert pm.ece == pytest.approx(1 - np.mean(conf))


def test_optimal_key_door_episode_on_a_hand_grid():
    from goalprobe.gridworld.core import Grid, Variant
    from goalprobe.gridworld.optimal import solve

    # # # # #      key K at (1, 3), door D at (2, 2), goal G at (3, 1)
    # A _ K #      optimal: RIGHT, RIGHT (key), LEFT (door opens when adjacent with the key),
    # # D # #      DOWN, DOWN, LEFT
    # G _ _ #
    # # # # #
    walls = np.ones((5, 5), dtype=bool)
    for cell in [(1, 1), (1, 2), (1, 3), (2, 2), (3, 1), (3, 2), (3, 3)]:
        walls[cell] = False
    grid = Grid(
        walls=walls, goal=(3, 1), start=(1, 1), key=(1, 3), door=(2, 2), variant=Variant.KEY_DOOR
    )
    policy = solve(grid)
    t = _rollout_trajectory(grid, policy, [R, R, L, D, D, L], "kd")
    assert t.success and t.n_steps == 6
    acc = trajectory_stage_accuracy(t)
    assert (acc.to_key, acc.to_door, acc.to_goal) == (1.0, 1.0, 1.0)
    assert (acc.n_to_key, acc.n_to_door, acc.n_to_goal) == (2, 1, 3)
    assert key_pickup_rate([t]) == 1.0
    # one detour before the key: DOWN from (1, 2) is a wall bump (door locked) -> not towards
    detour = _rollout_trajectory(grid, policy, [R, D, R, L, D, D, L], "kd")
    assert detour.success
    assert key_attraction_bias([detour], manhattan_key_distance(grid.key)) == KeyAttraction(
        1, 0, 0.0
    )
    assert stage_accuracy([t, detour]).to_key == pytest.approx((1.0 + 2 / 3) / 2)
