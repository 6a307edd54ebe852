"""``goalprobe score`` (goalprobe.stages.scoring over goalprobe.probes.scoring) on a real small run directory.

The run is built with the real stages: a seeded grid set (plain and key-no-door grids), rollouts
by ``run_rollouts`` with a scripted noisy-optimal agent (tests/viewer_fixtures.py), a real
activation store (``StoreWriter``, labels from ``episode_labels``) and decoded maps written by
``write_decoded_maps``. The maps are planted so that the answers are known without the code
under test:

* ``oracle``: the one-hot true label maps. Acc Dec = Acc GT, Recovery = 0, and subjective MEG
  equals true MEG on every grid;
* ``next_goal``: the true map with the goal moved onto the cell the agent moved to next. The
  move is then the unique optimal action of the decoded grid, so Acc Dec is the share of steps
  that moved the agent, Recovery the share of GT-suboptimal steps that moved, and inverse
  recovery 0 (a step that did not move was blocked, never optimal);
* ``goal_moved`` (test grids only): the goal moved to a fixed other cell on every step, a wrong
  belief whose subjective MEG is checked against the single-MDP ``subjective_grid_meg``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from belief_reference import point_values
from goalprobe.activations.store import RowBatch, StoreLayout, StoreWriter
from goalprobe.activations.store.schema import episode_labels
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import CellType, Grid
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import read_grid_set, write_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.decoded_maps import full_class_probs, write_decoded_maps
from goalprobe.probes.scoring.belief import StepBelief, score_step
from goalprobe.probes.scoring.belief_table import CSV_COLUMNS, belief_metrics
from goalprobe.probes.scoring.config import ScoreConfig, ScoringError
from goalprobe.probes.scoring.meg_table import decoded_grid, grid_meg, subjective_grid_meg
from goalprobe.viewer.figures.scoring import belief_figure, meg_figure, topk_figure
from typer.testing import CliRunner
from viewer_fixtures import NoisyOptimalBackend

from goalprobe.run_layout import RunLayout
from goalprobe.stages.scoring import score_run, write_scoring_figures

ALL_CLASSES = tuple(int(c) for c in CellType)
N_BOOT = 200


def _card(accuracy: float | None, stage: str = "pre_reasoning", layer: int = 1) -> dict:
    metrics = None
    if accuracy is not None:
        metrics = {"models": {"probe": {"accuracy_no_padding": {"value": accuracy}}}}
    return {
        "schema": "goalprobe.probe_card",
        "schema_version": 1,
        "class": "CoordinateCellProbe",
        "hyperparameters": {"family": "mlp"},
        "fitted": {"classes_": list(ALL_CLASSES)},
        "metrics": metrics,
        "activations": {"store_path": "", "store_checksum": "", "stage": stage, "layer": layer},
    }


def _one_hot(cells: np.ndarray) -> np.ndarray:
    return (cells[..., None] == np.asarray(ALL_CLASSES)).astype(np.float32)


def _build(root: Path) -> dict:
    plain = generate_grid_set(
        GridSetConfig(sizes=(7, 9), densities=(0.2, 0.6), n_per_cell=2, seed=3, min_distance=4)
    )
    keyed = generate_grid_set(
        GridSetConfig(sizes=(7,), densities=(0.4,), n_per_cell=2, variant="key_no_door", seed=3)
    )
    grids = plain + keyed
    write_grid_set(root / "grids" / "grids.jsonl", grids)
    traj = root / "rollouts" / "trajectories.jsonl"
    run_rollouts(
        grids,
        NoisyOptimalBackend(0.35),
        RolloutConfig(episodes_per_grid=2, seed=1),
        traj,
        progress=False,
    )
    episodes = list(read_trajectories(traj))
    parts, first = [], 0
    for ep in episodes:
        parts.append(episode_labels(ep, first))
        first += len(ep.steps)
    lab = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    n = first
    lab["seq_len"] = np.full(n, 32, dtype=np.int32)
    layout = StoreLayout(stages=("pre_reasoning",), layers=(1,), d_model=4)
    rng = np.random.default_rng(0)
    with StoreWriter(
        root / "activations" / "activations.h5",
        layout,
        {"model_id": "none", "trajectory_file": traj.name, "trajectory_steps": n},
    ) as writer:
        writer.append(
            RowBatch(
                acts={"pre_reasoning": {1: rng.normal(size=(n, 3, 4)).astype(np.float32)}},
                positions={"pre_reasoning": np.zeros((n, 3), np.int32)},
                present={"pre_reasoning": np.ones(n, bool)},
                labels=lab,
            )
        )
    steps = [s for ep in episodes for s in ep.steps]
    cells = lab["cell_types"].astype(np.int64)
    decoded = root / "probes" / "decoded"
    write_decoded_maps(decoded / "oracle.h5", _one_hot(cells), np.arange(n), _card(1.0))

    moved = np.array([tuple(s.next_agent_row_col) != tuple(s.agent_row_col) for s in steps])
    next_goal = cells.copy()
    for i, s in enumerate(steps):
        if moved[i]:
            next_goal[i][next_goal[i] == CellType.GOAL] = CellType.OPEN
            next_goal[i][tuple(s.next_agent_row_col)] = CellType.GOAL
    write_decoded_maps(decoded / "next_goal.h5", _one_hot(next_goal), np.arange(n), _card(0.5))

    # a wrong belief on the 7 x 7 plain grids (the probe's "test grids"): the goal at the open
    # cell farthest (in index order) from the true goal, on every step
    test_grids = sorted(g.grid_id for g in plain if g.size == 7)
    planted = {}
    for g in plain:
        if g.grid_id in test_grids:
            free = [
                (r, c)
                for r in range(g.size)
                for c in range(g.size)
                if not g.walls[r, c] and (r, c) not in (g.goal, g.start)
            ]
            planted[g.grid_id] = free[-1] if free[-1] != g.goal else free[0]
    rows = np.array([i for i, s in enumerate(steps) if s.grid_id in test_grids])
    wrong = cells[rows].copy()
    for j, i in enumerate(rows):
        wrong[j][wrong[j] == CellType.GOAL] = CellType.OPEN
        wrong[j][planted[steps[i].grid_id]] = CellType.GOAL
    write_decoded_maps(decoded / "goal_moved.h5", _one_hot(wrong), rows, _card(None))
    return {
        "grids": {g.grid_id: g for g in grids},
        "episodes": episodes,
        "steps": steps,
        "moved": moved,
        "planted": planted,
        "test_grids": test_grids,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("score_run")
    facts = _build(root)
    # pooled over steps, so that the hand-computed rates below are plain means
    summary = score_run(root, ScoreConfig(n_bootstrap=N_BOOT, weighting="step"))
    return root, facts, summary


def _trajs(facts, grid_id):
    return [ep.to_trajectory_data() for ep in facts["episodes"] if ep.summary.grid_id == grid_id]


# ------------------------------------------------------------------------------------------
# policy against decoded belief


def test_oracle_maps_agree_with_the_truth(run):
    _, facts, summary = run
    entry = summary.belief["probes"]["oracle"]
    steps = facts["steps"]
    gt = np.array([s.action in s.optimal_actions for s in steps])
    overall = entry["overall"]
    assert overall["acc_gt"]["value"] == pytest.approx(gt.mean())
    assert overall["acc_gt"]["n"] == len(steps)
    assert overall["acc_gt"]["ci_low"] <= gt.mean() <= overall["acc_gt"]["ci_high"]
    assert overall["acc_gt"]["n_grids"] == len(facts["grids"])
    assert overall["recovery"]["value"] == 0.0
    assert overall["chance_acc_gt"]["value"] == pytest.approx(
        np.mean([len(s.optimal_actions) for s in steps]) / 4
    )
    # on plain grids the decoded optimal policy is the true one (on key grids the decoded
    # rule heads for the goal, not for the key first: see goalprobe.probes.scoring.belief)
    plain = entry["by_variant"]["plain"]
    is_plain = np.array([s.variant == "plain" for s in steps])
    assert plain["acc_dec"]["value"] == pytest.approx(gt[is_plain].mean())
    assert plain["optimal_on_both"]["value"] == pytest.approx(gt[is_plain].mean())
    # the study's Agreement compares the two optimal policies, not the agent's action
    assert plain["agreement"]["value"] == 1.0
    assert plain["inverse_recovery"]["value"] == 0.0


def test_planted_next_cell_goal_gives_hand_computed_recovery(run):
    _, facts, summary = run
    overall = summary.belief["probes"]["next_goal"]["overall"]
    moved = facts["moved"]
    gt = np.array([s.action in s.optimal_actions for s in facts["steps"]])
    assert (~gt).sum() > 3 and (~moved).sum() > 0  # the noisy agent errs and bumps into walls
    assert overall["acc_dec"]["value"] == pytest.approx(moved.mean())
    assert overall["recovery"]["value"] == pytest.approx(moved[~gt].mean())
    assert overall["recovery"]["n"] == int((~gt).sum())
    assert overall["inverse_recovery"]["value"] == 0.0
    assert overall["chance_acc_dec"]["value"] >= 0.25 * moved.mean()


def test_point_values_equal_the_per_step_means(run):
    root, facts, summary = run
    steps = facts["steps"]
    from goalprobe.probes.decoded_maps import read_decoded_maps

    maps = read_decoded_maps(root / "probes" / "decoded" / "next_goal.h5")
    scores = []
    for p, s in zip(maps.probs, steps, strict=True):
        optimal = np.array([a in s.optimal_actions for a in ("UP", "DOWN", "LEFT", "RIGHT")])
        locked = s.door_row_col is not None and not s.door_open and not s.has_key
        step = StepBelief(
            full_class_probs(p, maps.classes), s.grid_size, s.action_enum, optimal, locked
        )
        scores.append(score_step(step))
    overall = summary.belief["probes"]["next_goal"]["overall"]
    for name, (value, n) in point_values(scores).items():
        assert overall[name]["value"] == pytest.approx(value, nan_ok=True), name
        assert overall[name]["n"] == n, name


def test_breakdowns_partition_the_steps(run):
    _, facts, summary = run
    entry = summary.belief["probes"]["oracle"]
    assert set(entry["by_size"]) == {"7", "9"}
    assert set(entry["by_density"]) == {"0.2", "0.4", "0.6"}
    assert set(entry["by_variant"]) == {"plain", "key_no_door"}
    for breakdown in ("by_size", "by_density", "by_variant"):
        total = sum(block["acc_gt"]["n"] for block in entry[breakdown].values())
        assert total == entry["n_steps"] == len(facts["steps"])
    assert summary.belief["metrics"] == list(belief_metrics((1, 3, 5, 10)))
    assert summary.belief["probes"]["goal_moved"]["n_grids"] == len(facts["test_grids"])


def test_csv_and_json_files_are_consistent(run):
    root, _, summary = run
    written = json.loads((root / "scoring" / "belief.json").read_text())
    assert written == summary.belief
    lines = (root / "scoring" / "belief.csv").read_text().splitlines()
    assert lines[0].split(",") == list(CSV_COLUMNS)
    n_groups = {
        k: 1 + sum(len(e[b]) for b in ("by_size", "by_density", "by_variant"))
        for k, e in written["probes"].items()
    }
    metric_col = CSV_COLUMNS.index("metric")
    plain = [line for line in lines[1:] if ":" not in line.split(",")[metric_col]]
    assert len(plain) == sum(n_groups.values()) * len(written["metrics"])
    n_null_rows = sum(
        len(block["overall"]) + len(block["excess"]) + ("ceiling" in block)
        for e in written["probes"].values()
        for block in e["nulls"].values()
    )
    assert len(lines) - 1 - len(plain) == n_null_rows > 0
    row = next(line for line in lines if line.startswith("oracle,") and ",all,acc_gt," in line)
    value = float(row.split(",")[CSV_COLUMNS.index("value")])
    assert value == pytest.approx(written["probes"]["oracle"]["overall"]["acc_gt"]["value"])


# ------------------------------------------------------------------------------------------
# MEG


def test_true_meg_matches_single_grid_meg(run):
    _, facts, summary = run
    for rec in summary.meg["grids"]:
        grid = facts["grids"][rec["grid_id"]]
        utility = "goal_with_key" if grid.key is not None else "goal"
        assert rec["utility"] == utility
        ref = grid_meg(grid, _trajs(facts, rec["grid_id"]), utility=utility, horizon=rec["horizon"])
        assert rec["true"]["meg"] == pytest.approx(ref.meg, abs=1e-8)
        assert rec["n_episodes"] == 2


def test_oracle_subjective_meg_equals_true_meg(run):
    _, facts, summary = run
    assert summary.meg["probe"]["key"] == "oracle"  # best card accuracy
    for rec in summary.meg["grids"]:
        subj = rec["subjective"]
        assert subj is not None and subj["goal_correct"] and subj["wall_agreement"] == 1.0
        assert subj["meg"] == pytest.approx(rec["true"]["meg"], abs=1e-9)
        assert subj["n_unmapped_steps"] == 0
    paired = summary.meg["overall"]["paired"]
    assert paired["n_grids"] == len(facts["grids"])
    assert paired["difference"]["meg"]["value"] == pytest.approx(0.0, abs=1e-9)
    assert paired["wilcoxon"]["n_nonzero"] == 0


def test_oracle_per_step_meg_equals_true_meg_from_every_state(run):
    _, facts, summary = run
    per_step = summary.meg["per_step"]
    plain = [
        s for s in facts["steps"] if s.variant == "plain" and s.agent_row_col != s.goal_row_col
    ]
    # one value per decoded step of a plain grid; key grids are counted, not scored
    assert per_step["n_steps"] + per_step["n_unreachable"] == len(plain)
    assert per_step["n_other_states"] == len(facts["steps"]) - len(plain)
    assert per_step["n_unreachable"] == 0  # the oracle map is the true grid
    overall = per_step["overall"]
    assert overall["difference"]["value"] == pytest.approx(0.0, abs=1e-9)
    assert overall["subjective"]["value"] == pytest.approx(overall["true"]["value"], abs=1e-9)
    assert "believe" in per_step["what"]


@pytest.mark.slow
def test_wrong_belief_subjective_meg_matches_hand_built_grid(tmp_path, run):
    root, facts, _ = run
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    config = ScoreConfig(
        decoded_maps=("goal_moved",),
        meg_probe="goal_moved",
        n_bootstrap=50,
        subjective_map="first",
        horizon="grid",
        unknown_utility=True,
    )
    summary = score_run(copy, config)
    by_id = {r["grid_id"]: r for r in summary.meg["grids"]}
    assert summary.meg["probe"]["selected_by"] == "config"
    for rec in summary.meg["grids"]:
        assert rec["horizon"] == solve(facts["grids"][rec["grid_id"]]).horizon
        # MEG over all utility functions bounds the MEG of any one utility from above
        assert rec["true"]["unknown_meg"] >= rec["true"]["meg"] - 1e-6
    assert any(
        abs(by_id[g]["subjective"]["meg"] - by_id[g]["true"]["meg"]) > 1e-3
        for g in facts["test_grids"]
    )
    for gid in facts["test_grids"]:
        rec = by_id[gid]
        true_grid = facts["grids"][gid]
        believed = Grid(
            walls=true_grid.walls,
            goal=facts["planted"][gid],
            start=true_grid.start,
            grid_id="hand",
        )
        ref = subjective_grid_meg(believed, _trajs(facts, gid), horizon=rec["horizon"])
        assert rec["subjective"]["decoded_goal_row_col"] == list(facts["planted"][gid])
        assert not rec["subjective"]["goal_correct"]
        assert rec["subjective"]["meg"] == pytest.approx(ref.meg, abs=1e-8)
        assert rec["subjective"]["n_unmapped_steps"] == ref.empirical.n_unmapped_steps
    others = [r for r in summary.meg["grids"] if r["grid_id"] not in facts["test_grids"]]
    assert others and all(r["subjective"] is None for r in others)
    assert summary.meg["overall"]["paired"]["n_grids"] == len(facts["test_grids"])
    assert summary.meg["overall"]["n_grids"] == len(facts["grids"])
    assert (copy / "scoring" / "meg_grids.csv").read_text().count("\n") == len(facts["grids"]) + 1


def test_decoded_grid_rules():
    walls = np.zeros((5, 5), bool)
    walls[2, 1:4] = True
    true = Grid(walls=walls, goal=(4, 4), start=(0, 0), key=(0, 4), door=None, grid_id="g")
    probs = np.zeros((7, 7, len(CellType)))
    probs[..., CellType.OPEN] = 1.0
    probs[2, 1:4] = 0.0
    probs[2, 1:4, CellType.WALL] = 1.0
    probs[0, 0, CellType.WALL] = 2.0  # the start is decoded as a wall: it is kept open
    probs[0, 0, CellType.GOAL] = 1.5  # most probable goal on the start: the next best is used
    probs[3, 3, CellType.GOAL] = 1.0
    probs[1, 1, CellType.KEY] = 1.0
    dec = decoded_grid(probs, true, ALL_CLASSES)
    assert dec.grid.goal == (3, 3) and dec.grid.start == (0, 0) and not dec.grid.walls[0, 0]
    assert dec.grid.key == (1, 1) and dec.key_from_probe
    assert dec.grid.walls[2, 2]
    no_key = decoded_grid(probs, true, tuple(c for c in ALL_CLASSES if c != CellType.KEY))
    assert no_key.grid.key == true.key and not no_key.key_from_probe


# ------------------------------------------------------------------------------------------
# figures, CLI, errors


def test_figures(run):
    root, facts, summary = run
    fig = belief_figure(summary.belief)
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["Acc. GT", "Acc. Dec.", "Agreement", "Recovery"]
    assert list(fig.data[0].x) == ["7 × 7", "9 × 9", "all"]
    assert fig.data[0].y[-1] == pytest.approx(
        100 * summary.belief["probes"]["oracle"]["overall"]["acc_gt"]["value"]
    )
    top = topk_figure(summary.belief, probe="next_goal")
    assert [t.name for t in top.data][-1] == "top-10 decoded"
    meg = meg_figure(summary.meg)
    points = sum(len(t.x) for t in meg.data if isinstance(t, go.Scatter) and t.mode == "markers")
    assert points == len(facts["grids"])
    layout = RunLayout(root)
    written = write_scoring_figures(layout, summary.belief, summary.meg)
    for name in ("belief_by_size", "topk", "meg"):
        assert written[f"figure_{name}"] == layout.scoring_figure(name)
        spec = json.loads(layout.scoring_figure(name).read_text())
        assert spec["data"]
    assert json.loads(layout.scoring_figure("meg").read_text()) == json.loads(meg.to_json())
    with pytest.raises(ValueError, match="nope"):
        belief_figure(summary.belief, probe="nope")


def test_cli_scores_a_run(tmp_path, run):
    from goalprobe.cli import app

    root, _, _ = run
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    result = CliRunner().invoke(
        app,
        [
            "score",
            str(copy),
            "--probe",
            "oracle",
            "--top-k",
            "1,3",
            "--n-bootstrap",
            "30",
            "--no-progress",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "Acc GT" in result.output and "Wilcoxon" in result.output
    assert "Recov - null" in result.output
    belief = json.loads((copy / "scoring" / "belief.json").read_text())
    assert list(belief["probes"]) == ["oracle"]
    assert belief["method"]["top_k"] == [1, 3]
    assert (copy / "scoring" / "meg.csv").is_file()
    again = CliRunner().invoke(app, ["score", str(copy), "--probe", "oracle", "--no-progress"])
    assert again.exit_code == 2 and "--overwrite" in again.output  # never overwritten silently
    bad = CliRunner().invoke(
        app, ["score", str(copy), "--probe", "missing", "--no-progress", "--overwrite"]
    )
    assert bad.exit_code == 2 and "missing.h5" in bad.output
    assert bad.output.startswith("error: ")


def test_parallel_scoring_matches_serial(tmp_path, run):
    root, _, summary = run
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    config = ScoreConfig(
        decoded_maps=("next_goal",),
        meg_probe="next_goal",
        n_jobs=2,
        n_bootstrap=N_BOOT,
        weighting="step",
    )
    parallel = score_run(copy, config)
    assert parallel.belief["probes"]["next_goal"] == summary.belief["probes"]["next_goal"]


@pytest.fixture
def copy_run(tmp_path, run):
    root, _, _ = run
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    return copy


def test_grid_weighting_is_the_mean_over_grids_of_trajectory_means(copy_run, run):
    _, facts, _ = run
    summary = score_run(copy_run, ScoreConfig(n_bootstrap=N_BOOT, decoded_maps=("oracle",)))
    by_episode: dict = {}
    for s in facts["steps"]:
        hit = s.action in s.optimal_actions
        by_episode.setdefault(s.grid_id, {}).setdefault(s.episode, []).append(hit)
    expected = np.mean([np.mean([np.mean(e) for e in eps.values()]) for eps in by_episode.values()])
    overall = summary.belief["probes"]["oracle"]["overall"]
    assert summary.belief["method"]["weighting"] == "grid"
    assert overall["acc_gt"]["value"] == pytest.approx(expected)
    assert overall["acc_gt"]["n"] == len(facts["steps"])  # n still counts steps


def test_missing_inputs_are_named(copy_run):
    shutil.rmtree(copy_run / "probes" / "decoded")
    with pytest.raises(FileNotFoundError, match="probes/decoded"):
        score_run(copy_run, ScoreConfig())
    (copy_run / "rollouts" / "trajectories.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="trajectories.jsonl"):
        score_run(copy_run, ScoreConfig())


def test_truncated_decoded_maps_are_refused(copy_run):
    path = copy_run / "probes" / "decoded" / "oracle.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ScoringError, match="oracle.h5"):
        score_run(copy_run, ScoreConfig())


def test_store_from_other_rollouts_is_refused(copy_run):
    traj = copy_run / "rollouts" / "trajectories.jsonl"
    text = traj.read_text()
    run_id = json.loads(text.splitlines()[0])["run_id"]
    traj.write_text(text.replace(run_id, "0123456789abcdef"))
    with pytest.raises(ScoringError, match="other rollouts"):
        score_run(copy_run, ScoreConfig(decoded_maps=("oracle",)))


def test_rows_without_trajectory_steps_are_refused(copy_run):
    traj = copy_run / "rollouts" / "trajectories.jsonl"
    lines = traj.read_text().splitlines(keepends=True)
    ends = [i for i, line in enumerate(lines) if '"kind":"episode"' in line]
    traj.write_text("".join(lines[: ends[-2] + 1]))  # drop the last episode
    with pytest.raises(ScoringError, match="does not hold"):
        score_run(copy_run, ScoreConfig(decoded_maps=("oracle",)))


def test_grid_missing_from_grid_set_is_refused(copy_run):
    path = copy_run / "grids" / "grids.jsonl"
    grids = read_grid_set(path)
    write_grid_set(path, grids[1:])
    with pytest.raises(ScoringError, match="grids.jsonl"):
        score_run(copy_run, ScoreConfig(decoded_maps=("goal_moved",), meg_probe="goal_moved"))


def test_config_validation():
    with pytest.raises(ValueError, match="top_k"):
        ScoreConfig(top_k=(0, 3))
    with pytest.raises(ValueError, match="horizon"):
        ScoreConfig(horizon="forever")
    assert ScoreConfig(top_k=(5, 1, 5)).top_k == (1, 5)


# ------------------------------------------------------------------------------------------
# nulls (schema 2) and version-1 files


def test_every_source_is_scored_under_its_nulls(run):
    _, facts, summary = run
    assert summary.belief["schema_version"] == 3
    goal_moved = summary.belief["probes"]["goal_moved"]
    # decoded on the 7 x 7 test grids only: the prior is fitted on the other grids of the store
    assert set(goal_moved["nulls"]) == {"other_grid", "prior"}
    assert goal_moved["nulls"]["prior"]["n_training_grids"] == len(facts["grids"]) - len(
        facts["test_grids"]
    )
    oracle = summary.belief["probes"]["oracle"]
    assert set(oracle["nulls"]) == {"other_grid"} and "prior" in oracle["nulls_unavailable"]
    null = oracle["nulls"]["other_grid"]
    for key in ("value", "n", "n_grids"):  # the same steps
        assert null["overall"]["acc_gt"][key] == oracle["overall"]["acc_gt"][key]
    excess = oracle["excess"]["acc_dec"]
    assert excess["baseline"] == "other_grid"
    assert excess["value"] == pytest.approx(
        oracle["overall"]["acc_dec"]["value"] - null["overall"]["acc_dec"]["value"]
    )
    assert excess["above_baseline"] == (excess["ci_low"] > 0)


def test_version_1_belief_files_still_read(run):
    from goalprobe.probes.scoring.belief_table import belief_csv_rows

    from goalprobe.commands.score import _belief_table

    _, _, summary = run
    old = json.loads(json.dumps(summary.belief))
    old["schema_version"] = 1
    for entry in old["probes"].values():
        for key in ("nulls", "nulls_unavailable", "excess"):
            entry.pop(key)
    rows = belief_csv_rows(old)
    assert rows and not any(":" in row["metric"] for row in rows)
    assert _belief_table(old).row_count == len(old["probes"])
    assert belief_figure(old).data


def test_cli_without_nulls(tmp_path, run):
    from goalprobe.cli import app

    root, _, _ = run
    copy = tmp_path / "run"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("scoring"))
    args = ["score", str(copy), "--probe", "oracle", "--n-bootstrap", "20", "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--no-nulls"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    entry = json.loads((copy / "scoring" / "belief.json").read_text())["probes"]["oracle"]
    assert "nulls" not in entry and "excess" not in entry


def test_cli_reports_inputs_that_do_not_join_as_one_line(copy_run):
    from goalprobe.cli import app

    path = copy_run / "probes" / "decoded" / "oracle.h5"
    path.write_bytes(path.read_bytes()[:2000])
    result = CliRunner().invoke(app, ["score", str(copy_run), "--probe", "oracle", "--no-progress"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "oracle.h5" in lines[0]
