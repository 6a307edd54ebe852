"""Unit tests of the viewer: figure functions, the lazy run loader, step views and the export.

Data tests run on a real run directory built from the grid world, a scripted rollout, a real
activation store and the probes' HDF5 writers (tests/viewer_fixtures.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import numpy as np
import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD, Action, CellType
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, parse
from goalprobe.viewer.data import (
    RunData,
    UnknownKeyError,
    UnsafePathError,
    full_class_probs,
)
from goalprobe.viewer.figures.behaviour import (
    behaviour_by_distance_figure,
    behaviour_grid_figure,
    iso_accuracy_figure,
)
from goalprobe.viewer.figures.maps import (
    cell_map_figure,
    episode_timeline_figure,
    plan_figure,
    probability_figure,
)
from goalprobe.viewer.figures.patching import patch_summary_figure, patching_heatmap_figure
from goalprobe.viewer.figures.plans import (
    STRIP_COLOURS,
    plan_strip_categories,
    plan_strip_figure,
    prefix_accuracy_grid_figure,
    sweep_runs,
)
from goalprobe.viewer.figures.probes import (
    BASELINES,
    baseline_values,
    localisation_figure,
    per_class_figure,
    probe_comparison_figure,
    sweep_comparison_figure,
)
from goalprobe.viewer.figures.style import (
    ACTION_ARROWS,
    DECODED_COLOUR,
    EXECUTED_COLOUR,
    empty_figure,
)
from goalprobe.viewer.run_files import N_CLASSES
from goalprobe.viewer.step import (
    NO_FALSE_BELIEF,
    build_false_belief_step,
    build_step_view,
    decoded_view,
    episode_flags,
    false_belief_step_figure,
    step_figures,
)
from viewer_fixtures import shared_run

# ------------------------------------------------------------------------------------------
# figures


def _onehot(types: np.ndarray) -> np.ndarray:
    return np.eye(N_CLASSES, dtype=np.float32)[types]


def _grid_types() -> np.ndarray:
    grid, state = parse(
        "  0 1 2 3 4\n0 # # # # #\n1 # _ _ G #\n2 # A _ _ #\n3 # _ # _ #\n4 # # # # #"
    )
    return cell_types(grid, state).astype(np.int64)


def _annotation_arrows(fig) -> list:
    return [a for a in fig.layout.annotations if a.showarrow]


def test_cell_map_figure_draws_classes_symbols_and_arrows():
    types = _grid_types()
    fig = cell_map_figure(
        types,
        agent_row_col=(2, 1),
        action=int(Action.UP),
        optimal_actions=[int(Action.UP), int(Action.RIGHT)],
        history=[(3, 1), (2, 1)],
    )
    heat = fig.data[0]
    assert np.array_equal(np.asarray(heat.z), types)
    assert heat.text[2][1] == "A" and heat.text[1][3] == "G" and heat.text[0][0] == ""
    arrows = _annotation_arrows(fig)
    assert len(arrows) == 3  # two optimal, one executed
    executed = [a for a in arrows if a.arrowcolor == EXECUTED_COLOUR]
    assert len(executed) == 1 and executed[0].y < executed[0].ay  # UP points to a smaller row
    assert list(fig.layout.yaxis.range) == [4.5, -0.5]  # row 0 at the top
    assert "true: agent" in heat.customdata[2][1]
    with pytest.raises(ValueError, match="cell_types"):
        cell_map_figure(np.zeros(5))


def test_decoded_map_hover_lists_probabilities_most_probable_first():
    types = _grid_types()
    probs = _onehot(types) * 0.7 + 0.3 / N_CLASSES
    probs[1, 2] = 0
    probs[1, 2, CellType.WALL], probs[1, 2, CellType.OPEN] = 0.25, 0.75
    fig = cell_map_figure(probs.argmax(-1), probs=probs, true_cell_types=types)
    hover = fig.data[0].customdata[1][2]
    assert "true: open" in hover and "decoded: open" in hover
    assert hover.index("P(open) = 0.75") < hover.index("P(wall) = 0.25")
    with pytest.raises(ValueError, match="do not match"):
        cell_map_figure(types, probs=probs[:3])


def test_probability_figure_outlines_true_cells_of_the_class():
    types = _grid_types()
    probs = _onehot(types)
    fig = probability_figure(probs[:, :, CellType.WALL], CellType.WALL, true_cell_types=types)
    assert np.allclose(np.asarray(fig.data[0].z), probs[:, :, CellType.WALL])
    assert len(fig.layout.shapes) == int((types == CellType.WALL).sum())
    goal = probability_figure(probs[:, :, CellType.GOAL], CellType.GOAL, true_cell_types=types)
    (shape,) = goal.layout.shapes
    assert (shape.x0 + 0.5, shape.y0 + 0.5) == (3, 1)


@pytest.mark.parametrize(
    ("predicted", "target", "prefix"),
    [
        ([0, 0, 1, PLAN_END, PLAN_PAD], [0, 0, 1, PLAN_END, PLAN_PAD], 4),
        ([0, 0, 2, 2, 2], [0, 0, 1, PLAN_END, PLAN_PAD], 2),
        ([0, 0, 1, 2, 2], [0, 0, 1, PLAN_END, PLAN_PAD], 3),  # END must be predicted
        ([1, 0, 1, PLAN_END, PLAN_PAD], [0, 0, 1, PLAN_END, PLAN_PAD], 0),
    ],
)
def test_plan_strip_reports_the_matched_prefix(predicted, target, prefix):
    fig = plan_strip_figure(predicted, target)
    title = fig.layout.title.text
    if prefix == 4:
        assert title.startswith("Plan: all 4 executed tokens match")
    else:
        assert f"the first {prefix} of 4 executed tokens match" in title
    glyphs = {**ACTION_ARROWS, PLAN_PAD: "·"}
    assert list(fig.data[0].text[0]) == [glyphs[p] for p in predicted]
    # the caption agrees with the colours: exactly `prefix` decoded cells are green
    cats = plan_strip_categories(predicted, target)
    order = list(STRIP_COLOURS)
    assert list(fig.data[0].z[0]).count(order.index("match")) == prefix == cats["prefix"]


def test_plan_strip_never_colours_end_or_padding_as_a_match():
    # the executed plan is DOWN, END; the decoder keeps saying DOWN: only t is a real match
    target = [int(Action.DOWN), PLAN_END, PLAN_PAD, PLAN_PAD, PLAN_PAD]
    predicted = [int(Action.DOWN)] * 5
    fig = plan_strip_figure(predicted, target)
    order = list(STRIP_COLOURS)
    decoded, executed = (list(row) for row in fig.data[0].z)
    assert decoded == [order.index(c) for c in ("match", "miss", "padding", "padding", "padding")]
    assert executed[1] == order.index("end") and executed[2:] == [order.index("padding")] * 3
    assert "the first 1 of 2 executed tokens match" in fig.layout.title.text
    assert list(fig.data[0].text[1])[:3] == ["↓", "END", "·"]
    # colours of END and padding differ from the match colour
    assert len({STRIP_COLOURS[c] for c in ("match", "padding", "end")}) == 3
    # equal tokens after the first miss are not counted as matches
    cats = plan_strip_categories([0, 1, 1, PLAN_END, PLAN_PAD], [0, 0, 1, PLAN_END, PLAN_PAD])
    assert cats["decoded"] == ["match", "miss", "after_miss", "after_miss", "padding"]
    assert cats["prefix"] == 1 and cats["scored"] == 4


def test_plan_figure_draws_both_paths_with_an_arrow_per_move():
    types = _grid_types()
    executed = [(2, 1), (1, 1), (1, 2), (1, 3)]
    predicted = [(2, 1), (2, 2), (2, 2), (1, 2)]  # one blocked move: no arrow for it
    fig = plan_figure(types, executed_path=executed, predicted_path=predicted)
    names = [t.name for t in fig.data if t.type == "scatter"]
    assert names == ["executed", "decoded plan"]
    colours = [a.arrowcolor for a in _annotation_arrows(fig)]
    assert colours.count(EXECUTED_COLOUR) == 3 and colours.count(DECODED_COLOUR) == 2


def test_timeline_marks_unknown_steps_and_the_current_step():
    fig = episode_timeline_figure({"a": [True, False, None], "b": [True]}, current_step=1)
    z = fig.data[0].z
    assert list(z[0]) == [1.0, 0.0, None] and list(z[1]) == [1.0, None, None]
    (shape,) = fig.layout.shapes
    assert (shape.x0, shape.x1) == (0.5, 1.5)
    with pytest.raises(ValueError):
        episode_timeline_figure({})


def test_patching_heatmap_averages_rates_and_skips_undefined_values():
    base = {"direction": "cf_to_base", "site": "grid"}
    records = [
        {**base, "layers": "3", "recovered": 0.2, "action_changed": True},
        {**base, "layers": "3", "recovered": 0.6, "action_changed": False},
        {**base, "layers": "3", "recovered": math.nan, "action_changed": False},
        {**base, "layers": "all", "recovered": 1.0, "action_changed": True},
        {**base, "site": "answer", "layers": "all", "recovered": -0.5, "action_changed": True},
    ]
    fig = patching_heatmap_figure(records)
    heat = fig.data[0]
    assert list(heat.x) == ["3", "all"] and list(heat.y) == ["grid", "answer"]
    assert heat.z[0][0] == pytest.approx(0.4) and heat.z[1][0] is None
    assert "n = 2" in heat.customdata[0][0]
    rates = patching_heatmap_figure(records, value="action_changed", facet=None)
    assert rates.data[0].z[0][0] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        patching_heatmap_figure([])


def test_a_plan_sweep_is_drawn_as_the_one_prefix_accuracy_figure():
    """``sweep.json`` runs (decoders with CIs, shuffled controls) become the small multiples
    the viewer, the report and train-plan-decoder all draw: bands for decoders, 0.25^N."""

    def run(stage, layer, kind, depth, acc):
        ci = [[a - 0.05 for a in acc], [a + 0.05 for a in acc]]
        return {"stage": stage, "layer": layer, "kind": kind, "decoder_layers": depth,
                "metrics": {"prefix_accuracy": acc, "prefix_accuracy_ci": ci}}  # fmt: skip

    runs = [
        run("pre_reasoning", 1, "decoder", 1, [0.6, 0.3, 0.1]),
        run("pre_reasoning", 1, "shuffled_control", 1, [0.3, 0.1, 0.02]),
        run("post_reasoning", 1, "decoder", 1, [0.7, 0.4, 0.2]),
    ]
    converted = sweep_runs(runs)
    assert converted[0]["n_layers"] == 1 and converted[1]["ci"] is None
    fig = prefix_accuracy_grid_figure(converted)
    baselines = [t for t in fig.data if t.name and "0.25^N" in t.name]
    assert len(baselines) == 2  # one per panel (stage x layer)
    assert np.allclose(baselines[0].y, 0.25 ** np.arange(1, 4))
    assert sum(t.fill == "toself" for t in fig.data) == 2  # the two decoders' bands


def test_probe_comparison_bars_have_asymmetric_intervals():
    rows = [
        {"name": "mlp L15", "group": "pre", "value": 0.7, "ci_low": 0.6, "ci_high": 0.75},
        {"name": "linear L15", "group": "pre", "value": 0.4},
        {"name": "mlp L15", "group": "post", "value": 0.6, "ci_low": 0.55, "ci_high": 0.7},
    ]
    fig = probe_comparison_figure(rows, baseline=0.3)
    pre, post = fig.data
    assert list(pre.x) == ["mlp L15", "linear L15"]
    assert np.allclose(pre.error_y.array, [0.05, 0.0]) and np.allclose(
        pre.error_y.arrayminus, [0.1, 0.0]
    )
    assert list(post.y) == [0.6, None]
    assert fig.layout.shapes[0].y0 == 0.3


def test_accuracy_bars_draw_every_control_of_the_sweep():
    models = {
        "probe": {"accuracy_no_padding": {"value": 0.8}},
        "majority": {"accuracy_no_padding": {"value": 0.5}},
        "prior_size": {"accuracy_no_padding": {"value": 0.55}},
        "prior_size_density": {"accuracy_no_padding": {"value": 0.6}},
        "shuffled": {"accuracy_no_padding": {"value": 0.52}},
        "uniform": {"accuracy_no_padding": None},
    }
    found = baseline_values(models, "accuracy_no_padding")
    assert found == {
        "majority": 0.5,
        "prior_size": 0.55,
        "prior_size_density": 0.6,
        "shuffled": 0.52,
    }
    rows = [
        {"name": "mlp L2", "group": "pre", "value": 0.8, "baselines": found},
        {"name": "mlp L3", "group": "pre", "value": 0.7, "baselines": {"majority": 0.45}},
        {"name": "mlp L2", "group": "post", "value": 0.6, "baselines": {"shuffled": 0.4}},
    ]
    fig = probe_comparison_figure(rows)
    marks = [t for t in fig.data if t.type == "scatter"]
    by_name = {}
    for t in marks:
        by_name.setdefault(t.name, []).append(t)
    assert set(by_name) == {label for label, _ in BASELINES.values()}
    majority = next(t for t in by_name[BASELINES["majority"][0]] if t.offsetgroup == "pre")
    assert list(majority.x) == ["mlp L2", "mlp L3"] and list(majority.y) == [0.5, 0.45]
    shuffled_post = next(t for t in by_name[BASELINES["shuffled"][0]] if t.offsetgroup == "post")
    assert list(shuffled_post.y) == [0.4, None]
    assert sum(t.showlegend for t in marks) == len(BASELINES)  # one legend entry per control


def test_prefix_accuracy_small_multiples_have_a_panel_per_stage_and_layer():
    acc = [0.5, 0.2, 0.05, 0.01]
    runs = []
    for stage in ("pre_reasoning", "post_reasoning"):
        for layer in (1, 2, 3):
            for n_layers in (1, 2):
                ci = [[a - 0.05 for a in acc], [a + 0.05 for a in acc]]
                runs.append(
                    dict(
                        stage=stage,
                        layer=layer,
                        kind="decoder",
                        n_layers=n_layers,
                        accuracy=acc,
                        ci=ci,
                    )
                )
            runs.append(
                dict(
                    stage=stage,
                    layer=layer,
                    kind="shuffled_control",
                    n_layers=1,
                    accuracy=[0.25, 0.06, 0.01, 0.0],
                )
            )
    fig = prefix_accuracy_grid_figure(runs)
    axes = {t.xaxis for t in fig.data}
    assert len(axes) == 6  # 2 stages x 3 layers
    titles = [a.text for a in fig.layout.annotations]
    assert "pre-reasoning · layer 1" in titles and "post-reasoning · layer 3" in titles
    for axis in axes:
        in_panel = [t for t in fig.data if t.xaxis == axis]
        random = [t for t in in_panel if t.name == "random 0.25^N"]
        assert len(random) == 1 and np.allclose(random[0].y, 0.25 ** np.arange(1, 5))
        assert sum(t.name == "shuffled control" for t in in_panel) == 1
        decoders = [t for t in in_panel if t.name.endswith("-layer decoder")]
        assert len(decoders) == 2 and decoders[0].line.color != decoders[1].line.color
    legend = [t.name for t in fig.data if t.showlegend is not False and t.name]
    assert sorted(set(legend)) == sorted(legend)  # each entry once
    with pytest.raises(ValueError):
        prefix_accuracy_grid_figure([])


def test_empty_states_wrap_at_word_boundaries():
    message = "No decoded map for this step: probes decode only their held-out test grids."
    fig = empty_figure(message, wrap=30)
    lines = fig.layout.annotations[0].text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= 30 for line in lines)
    assert " ".join(lines) == message


# ------------------------------------------------------------------------------------------
# the run directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def run(run_dir):
    return RunData(run_dir)


def test_index_matches_the_trajectory_file_and_lists_missing_artefacts(run, run_dir):
    episodes = list(read_trajectories(run_dir / "rollouts" / "trajectories.jsonl"))
    assert list(run.episodes) == [f"{e.summary.grid_id}:{e.summary.episode}" for e in episodes]
    missing = {m.path for m in run.missing}
    assert missing == {"scoring/meg.json", "report.html", "attribution/attribution.json"}
    assert {s.stage for s in run.map_sources.values()} == {"pre_reasoning", "post_reasoning"}
    assert run.map_sources["mlp_pre_L5"].family == "mlp"
    assert {p.n_layers for p in run.plan_sources.values()} == {1, 2}
    sizes = run.facets()["sizes"]
    assert sizes == [7, 9]
    only7 = run.filter_episodes(sizes=[7])
    assert only7 and all(i.summary.grid_size == 7 for i in only7)
    failures = run.filter_episodes(success=False)
    assert all(not i.summary.success for i in failures)


def test_episode_rows_join_the_store_by_ids(run, run_dir):
    key = list(run.episodes)[3]
    data = run.episode(key)
    assert [s.step for s in data.steps] == list(range(data.summary.length))
    with ActivationStore(run_dir / "activations" / "activations.h5") as store:
        labels = store.labels(["grid_id", "episode", "step"], rows=np.asarray(data.rows))
    assert set(labels["grid_id"].tolist()) == {data.info.grid_id}
    assert labels["episode"].tolist() == [data.info.episode] * len(data.rows)
    assert labels["step"].tolist() == list(range(len(data.rows)))
    assert data.grid.grid_id == data.info.grid_id and data.grid.start == data.summary.start_row_col


def test_decoded_maps_are_read_per_episode_and_match_the_file(run, run_dir):
    from goalprobe.probes.decoded_maps import read_decoded_maps

    full = read_decoded_maps(run_dir / "probes" / "decoded" / "mlp_post_L3.h5")
    position = {int(r): i for i, r in enumerate(full.row_ids)}
    for key in list(run.episodes)[-2:]:
        data = run.episode(key)
        maps = run.decoded_maps("mlp_post_L3", key)
        assert maps.values.shape == (len(data.rows), 15, 15, N_CLASSES)
        for t, row in enumerate(data.rows):
            assert maps.present[t] == (row in position)
            if maps.present[t]:
                expected = full_class_probs(full.probs[position[row]], full.classes)
                assert np.allclose(maps.values[t], expected)
            else:
                assert not maps.values[t].any()
    # the fixture leaves the last two store rows without a decoded map
    assert not run.decoded_maps("mlp_post_L3", list(run.episodes)[-1]).present[-2:].any()


def test_predicted_plans_match_the_file(run, run_dir):
    from goalprobe.probes.plan_metrics import read_predicted_plans

    key = next(k for k, p in run.plan_sources.items() if p.n_layers == 1)
    source = run.plan_sources[key]
    stored = read_predicted_plans(source.path, source.run)
    episode = list(run.episodes)[2]
    data = run.episode(episode)
    plans = run.predicted_plans(key, episode)
    assert plans.present.all()
    for t, row in enumerate(data.rows):
        assert np.array_equal(plans.values[t], stored.plans[list(stored.row_ids).index(row)])


def test_keys_from_the_browser_are_checked_against_allow_lists(run):
    for bad in ("../../etc/passwd", "/etc/passwd", "", None, ["x"], 3):
        with pytest.raises(UnknownKeyError):
            run.episode(bad)
        with pytest.raises(UnknownKeyError):
            run.map_source(bad)
        with pytest.raises(UnknownKeyError):
            run.plan_source(bad)
    with pytest.raises(UnsafePathError):
        run.files.resolve("../outside.h5")


def test_symlinks_out_of_the_run_are_refused(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    outside = tmp_path / "outside.h5"
    shutil.copy(copy / "probes" / "decoded" / "mlp_pre_L5.h5", outside)
    os.symlink(outside, copy / "probes" / "decoded" / "evil.h5")
    (copy / "scoring" / "belief.json").unlink()
    os.symlink(tmp_path / "secret.json", copy / "scoring" / "belief.json")
    (tmp_path / "secret.json").write_text('{"secret": 1}')
    run = RunData(copy)
    assert "evil" not in run.map_sources and "mlp_pre_L5" in run.map_sources
    refused = {m.path: m.reason for m in run.missing}
    assert "outside the run directory" in refused["probes/decoded/evil.h5"]
    assert "outside the run directory" in refused["scoring/belief.json"]
    assert run.scoring("belief") is None


def test_a_run_with_only_trajectories_still_opens(run_dir, tmp_path):
    bare = tmp_path / "bare"
    (bare / "rollouts").mkdir(parents=True)
    shutil.copy(run_dir / "rollouts" / "trajectories.jsonl", bare / "rollouts")
    run = RunData(bare)
    names = {m.name for m in run.missing}
    assert {"grid set", "activation store", "decoded maps", "predicted plans"} <= names
    assert {"patching results", "belief scoring", "MEG scoring"} <= names
    key = next(iter(run.episodes))
    view = build_step_view(run, key, 1)
    assert view.decoded is None and view.plan is None and view.patching == []
    figs = step_figures(view)
    assert figs["decoded"].layout.annotations[0].text.startswith("No decoded map: choose")
    assert RunData(tmp_path / "bare").episode(key).grid == run.episode(key).grid


def test_false_belief_steps_draw_true_shown_and_decoded_maps(run, run_dir, tmp_path):
    from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
    from goalprobe.probes.decoded_maps import read_step_maps
    from goalprobe.probes.scoring.false_belief import oracle_optimal_mask

    fb = run.false_belief_episodes()
    assert fb is not None and fb.maps_why is None
    on_disk = read_step_maps(run.layout.false_belief_decoded)
    assert len(fb.maps) == len(on_disk.grid_id) > 0
    lying = [
        k
        for k, e in fb.episodes.items()
        if pair_facts(fb.grids[e.summary.grid_id])["role"] == FALSE_BELIEF
    ]
    assert lying
    for key in lying:
        episode = fb.episodes[key]
        grid = fb.grids[episode.summary.grid_id]
        recorded = [tuple(c) for c in pair_facts(grid)["differs"]]
        for t, record in enumerate(episode.steps):
            view = build_false_belief_step(run, key, t)
            assert view.step == t and view.differs == recorded
            # the shown panel is the prompt's grid, the true panel the episode's
            on_shown_goal = record.agent_row_col == grid.prompt_grid.goal
            if not on_shown_goal:  # (there the prompt draws no goal)
                shown_grid, shown_state = parse(record.grid_text)
                assert np.array_equal(view.shown_cells, cell_types(shown_grid, shown_state))
            true_grid, true_state = parse(record.true_grid_text or record.grid_text)
            assert np.array_equal(view.true_cells, cell_types(true_grid, true_state))
            for r, c in recorded:
                if (r, c) != view.agent_row_col:
                    assert view.true_cells[r, c] != view.shown_cells[r, c]
            mask = oracle_optimal_mask(grid, record.state)
            assert view.optimal_shown == {Action(a) for a in np.flatnonzero(mask)}
            assert view.optimal_true == record.optimal_action_set
            fig = false_belief_step_figure(view)
            heatmaps = [tr for tr in fig.data if tr.type == "heatmap"]
            texts = [a.text for a in fig.layout.annotations]
            if t < len(episode.steps) - 1 and not on_shown_goal:
                # the fixture's stand-in probe decodes the prompt: its map is the shown grid
                assert np.array_equal(view.decoded.argmax, view.shown_cells)
                assert len(heatmaps) == 3
                assert np.array_equal(heatmaps[2].z, heatmaps[1].z)
            else:
                assert view.decoded is None and len(heatmaps) == 2
                assert any(text.startswith("No decoded map for this") for text in texts)
            assert np.array_equal(heatmaps[0].z, view.true_cells)
            assert texts[:3] == ["true grid", "shown to the agent (oracle belief)", "decoded map"]
            rings = [tr for tr in fig.data if tr.type == "scatter"]
            assert {(y, x) for y, x in zip(rings[0].y, rings[0].x, strict=True)} == set(recorded)
            arrows = [a for a in fig.layout.annotations if a.showarrow]
            assert len(arrows) == (0 if view.action is None else len(heatmaps))
    with pytest.raises(UnknownKeyError):
        build_false_belief_step(run, "../../etc/passwd:0", 0)
    # a run without the stage: the tab says what to do
    bare = tmp_path / "bare-fb"
    (bare / "rollouts").mkdir(parents=True)
    shutil.copy(run_dir / "rollouts" / "trajectories.jsonl", bare / "rollouts")
    assert RunData(bare).false_belief_episodes() is None
    assert "run goalprobe demo" in NO_FALSE_BELIEF


def test_truncated_trajectory_tail_is_ignored(run_dir, tmp_path):
    copy = tmp_path / "trunc"
    (copy / "rollouts").mkdir(parents=True)
    text = (run_dir / "rollouts" / "trajectories.jsonl").read_bytes()
    lines = text.splitlines(keepends=True)
    # drop the last summary line and cut the last step line in half
    (copy / "rollouts" / "trajectories.jsonl").write_bytes(b"".join(lines[:-2]) + lines[-2][:40])
    run = RunData(copy)
    assert len(run.episodes) == len(RunData(run_dir).episodes) - 1


def test_decoded_optimal_set_equals_the_true_one_for_a_perfect_map(run):
    for key in list(run.episodes)[:4]:
        data = run.episode(key)
        for record in data.steps:
            grid, state = parse(record.grid_text)
            probs = np.eye(N_CLASSES, dtype=np.float32)[
                np.pad(
                    cell_types(grid, state), (0, 15 - grid.size), constant_values=CellType.PADDING
                )
            ]
            view = decoded_view(
                probs, grid.size, source="perfect", classes=(0, 1, 2, 3, 6), door_locked=False
            )
            assert view.agent_row_col == record.agent_row_col
            assert view.goal_row_col == record.goal_row_col
            assert view.optimal == record.optimal_action_set == solve(grid).optimal_actions(state)


def test_step_view_joins_actions_plans_and_patching(run, run_dir):
    key = list(run.episodes)[0]
    data = run.episode(key)
    plan_key = next(k for k, p in run.plan_sources.items() if p.n_layers == 2)
    with ActivationStore(run_dir / "activations" / "activations.h5") as store:
        targets = store.labels(["plan"], rows=np.asarray(data.rows))["plan"]
    for t in range(len(data.steps)):
        view = build_step_view(run, key, t, map_source="mlp_pre_L5", plan_source=plan_key)
        assert view.action == data.steps[t].action_enum
        assert view.true_cells[view.agent_row_col] == CellType.AGENT
        assert np.array_equal(view.plan.target, targets[t])
        assert view.plan.executed_path[0] == data.steps[t].agent_row_col
        if np.array_equal(view.plan.predicted, view.plan.target):
            assert view.plan.prefix == int((view.plan.target != PLAN_PAD).sum())
            assert view.plan.predicted_path == view.plan.executed_path
        assert view.history[-1] == view.agent_row_col and len(view.history) == t + 1
    # the fixture has patching records for steps 0 and 1 of the first episode only
    assert len(build_step_view(run, key, 0).patching) == 18
    assert build_step_view(run, key, 2).patching == []
    assert build_step_view(run, key, 999).step == len(data.steps) - 1  # clipped
    flags = episode_flags(run, key, "mlp_pre_L5")
    truth = [s.action_enum in s.optimal_action_set for s in data.steps]
    assert flags["optimal (true grid)"] == truth
    assert len(flags["optimal (decoded grid)"]) == len(data.steps)


def test_prefix_accuracy_uses_the_test_split(run):
    key = next(k for k, p in run.plan_sources.items() if p.n_layers == 2)
    result = run.prefix_accuracy(key)
    assert result["rows"] == "test"
    acc = result["accuracy"]
    assert acc.shape == (10,) and np.all(np.diff(acc) <= 1e-12) and 0 < acc[0] <= 1


def test_probe_metrics_come_from_the_cards(run):
    rows = run.probe_metrics()
    assert {r["group"] for r in rows} == {"pre_reasoning", "post_reasoning"}
    mlp = {(r["group"], r["name"]): r["value"] for r in rows}
    assert mlp[("pre_reasoning", "mlp L5")] > mlp[("pre_reasoning", "linear L5")]
    assert all(
        r["baselines"]
        == {"majority": 0.55, "prior_size": 0.58, "prior_size_density": 0.6, "shuffled": 0.5}
        for r in rows
    )


def test_first_screen_is_a_step_with_a_decoded_map(run):
    from goalprobe.viewer.step import default_episode, default_map_source

    source = default_map_source(run)
    mapped = run.episodes_with_maps(source)
    # the fixture leaves the last two store rows without maps: the last episode's last steps
    assert mapped and mapped <= set(run.episodes)
    episode, step = default_episode(run, source)
    assert episode in mapped and run.decoded_maps(source, episode).present[step]
    view = build_step_view(run, episode, step, map_source=source)
    assert view.decoded is not None
    last = list(run.episodes)[-1]
    present = run.decoded_maps(source, last).present
    assert not present[-1]
    empty = build_step_view(run, last, len(present) - 1, map_source=source)
    figs = step_figures(empty)
    assert "test grids" in figs["decoded"].layout.annotations[0].text


# ------------------------------------------------------------------------------------------
# the static export and the command


def test_export_is_self_contained_and_escapes_run_text(run_dir, tmp_path):
    from goalprobe.viewer.export import export_html

    copy = tmp_path / "hostile"
    shutil.copytree(run_dir, copy)
    path = copy / "rollouts" / "trajectories.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    step = json.loads(lines[1])
    step["reasoning"] = "</script><script>window.pwned = 1</script> & <b>bold</b>"
    lines[1] = json.dumps(step, ensure_ascii=False, separators=(",", ":")) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    out = export_html(copy, tmp_path / "out.html", episodes=[step["grid_id"]])
    page = out.read_text(encoding="utf-8")
    assert "window.pwned" in page and "</script><script>window.pwned" not in page
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page
    assert "plotly.js" in page.lower() or "Plotly" in page
    blobs = re.findall(
        r'<script type="application/json" class="episode-data">(.*?)</script>', page, re.S
    )
    assert len(blobs) == len(
        [k for k in RunData(copy).episodes if k.startswith(step["grid_id"] + ":")]
    )
    payload = json.loads(blobs[0])
    assert payload["steps"][0]["reasoning"].startswith("</script>")
    assert set(payload["steps"][0]["figures"]) == {
        "timeline",
        "true",
        "decoded",
        "plan",
        "plan_strip",
    }
    assert set(payload["steps"][0]["probability"]) == {"open", "wall", "goal", "agent"}


def test_view_command_exports_and_rejects_unknown_selections(run_dir, tmp_path):
    import typer
    from typer.testing import CliRunner

    from goalprobe.commands.view import command

    app = typer.Typer()
    app.command()(command)
    out = tmp_path / "fig.html"
    key = next(iter(RunData(run_dir).episodes))
    result = CliRunner().invoke(
        app, [str(run_dir), "--export", str(out), "--episodes", key, "--probe", "linear_post_L3"]
    )
    assert result.exit_code == 0, result.output
    assert "linear · post · layer 3" in out.read_text(encoding="utf-8")
    again = CliRunner().invoke(app, [str(run_dir), "--export", str(out)])
    assert again.exit_code != 0 and "--overwrite" in again.output  # never overwritten silently
    bad = CliRunner().invoke(
        app, [str(run_dir), "--export", str(out), "--probe", "../x", "--overwrite"]
    )
    assert bad.exit_code != 0 and "unknown decoded-map source" in bad.output
    serve_with_selection = CliRunner().invoke(app, [str(run_dir), "--episodes", key])
    assert serve_with_selection.exit_code != 0


# ------------------------------------------------------------------------------------------
# figures of the report and of the files the application writes


def _stat(value: float, half: float = 0.1) -> dict:
    return {"value": value, "ci_low": value - half, "ci_high": value + half, "n": 4}


def test_behaviour_figures_place_each_metric_at_its_size_and_density():
    rng = np.random.default_rng(0)
    metrics = ("accuracy", "success_rate", "jsd", "entropy")
    cells = [
        {"size": s, "density": d, **{m: _stat(float(rng.uniform())) for m in metrics}}
        for s in (9, 7)
        for d in (0.3, 0.0)
    ]
    fig = behaviour_grid_figure(cells)
    assert len(fig.data) == len(metrics)
    for trace, metric in zip(fig.data, metrics, strict=True):
        assert list(trace.y) == ["7×7", "9×9"] and list(trace.x) == ["d=0", "d=0.3"]
        for cell in cells:
            row = list(trace.y).index(f"{cell['size']}×{cell['size']}")
            col = list(trace.x).index(f"d={cell['density']:g}")
            assert trace.z[row][col] == cell[metric]["value"]
    rows = [{"distance": d, "accuracy": _stat(0.5 + 0.1 * d), "jsd": _stat(0.1)} for d in (1, 2)]
    rows.append({"distance": 3, "accuracy": {"value": None}, "jsd": _stat(0.2, 0.05)})
    line = behaviour_by_distance_figure(rows)
    accuracy, jsd = line.data
    assert list(accuracy.x) == [1, 2] and list(jsd.x) == [1, 2, 3]  # undefined points left out
    assert list(jsd.error_y.array) == pytest.approx([0.1, 0.1, 0.05])
    tests = [
        {"transform": "reflect", "metric": "accuracy", "base_mean": 0.8, "transformed_mean": 0.7},
        {"transform": "rotate", "metric": "jsd", "base_mean": 0.1, "transformed_mean": 0.2},
        {"transform": "shift", "metric": "accuracy", "base_mean": None},
    ]
    bars = iso_accuracy_figure(tests)
    assert [list(t.x) for t in bars.data] == [["reflect"], ["reflect"]]
    assert [t.y[0] for t in bars.data] == [0.8, 0.7]


def test_probe_result_figures_read_the_sweep_metrics():
    def run(top1: float) -> dict:
        probe = {
            "recall/wall": _stat(top1),
            "recall/padding": _stat(1.0),
            "precision/wall": _stat(top1 / 2),
            "agent_top1": _stat(top1),
            "agent_manhattan": _stat(2.0),
            "goal_top1": _stat(top1 / 3),
            "goal_manhattan": _stat(3.0),
        }
        return {"models": {"probe": probe}}

    by_size = {"7": run(0.6), "9": run(0.3)}
    per_class = per_class_figure(by_size, "cell_mlp")
    assert [t.name for t in per_class.data] == ["recall wall", "precision wall"]  # no padding
    assert list(per_class.data[0].y) == [0.6, 0.3] and per_class.data[1].visible == "legendonly"
    groups = {"all": run(0.5), **by_size}
    localisation = localisation_figure(groups, "cell_mlp")
    top1 = [t for t in localisation.data if t.xaxis == "x"]
    assert [t.name for t in top1] == ["agent", "goal"]
    assert list(top1[0].x) == ["all", "7", "9"] and list(top1[0].y) == [0.5, 0.6, 0.3]
    sweep = {
        "config": {"target": "cell_type"},
        "estimator": {"class": "CoordinateMLPProbe"},
        "runs": [
            {"stage": "pre_reasoning", "layer": layer, "metrics": {"models": models}}
            for layer, models in (
                (1, {"probe": {"accuracy_no_padding": _stat(0.7)}}),
                (2, {"probe": {"accuracy_no_padding": _stat(0.8)}, "shuffled": {}}),
            )
        ],
    }
    comparison = sweep_comparison_figure(sweep)
    assert [t.name for t in comparison.data] == ["pre_reasoning probe"]
    assert list(comparison.data[0].y) == [0.7, 0.8] and list(comparison.data[0].x) == ["1", "2"]


def test_patch_summary_figure_draws_rates_by_site_and_layers():
    def row(kind, site, layers, rate, recovered=math.nan):
        return {
            "kind": kind,
            "mode": "teacher_forced",
            "direction": "base_to_cf",
            "site": site,
            "layers": layers,
            "n_runs": 5,
            "n_grids": 3,
            "action_changed_rate": rate,
            "action_changed_ci": (max(rate - 0.2, 0.0), min(rate + 0.2, 1.0)),
            "into_source_optimal_rate": rate,
            "into_source_optimal_ci": (max(rate - 0.2, 0.0), min(rate + 0.2, 1.0)),
            "stable_rate": 1 - rate,
            "recovered_mean": recovered,
            "recovered_ci": (recovered, recovered),
        }

    summary = [
        row("disjoint", "answer", "all", 1.0, 0.9),
        row("disjoint", "grid", "3", 0.2, 0.1),
        row("disjoint", "grid", "1+2", 0.4),
        row("control", "grid", "3", 0.0),
    ]
    fig = patch_summary_figure(summary)
    changed, recovered, stable = fig.data  # the first panel: into the source's optimal set
    assert list(changed.y) == ["grid", "answer"] and list(changed.x) == ["3", "1+2", "all"]
    assert list(changed.z[0]) == [0.2, 0.4, None] and changed.z[1][2] == 1.0
    assert recovered.z[0][1] is None  # undefined (NaN) recovery is left blank
    assert stable.z[0][0] == 1.0 and "no runs" in stable.hovertext[1][2]
    json_rows = [{**r, "recovered_mean": None} if r["layers"] == "1+2" else r for r in summary]
    assert patch_summary_figure(json_rows).data[1].z[0][1] is None  # null as read from JSON


def test_only_the_viewer_figures_draw():
    """The library computes, the application writes, goalprobe.viewer.figures draws: no other module
    builds a plotly figure."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    drawing = re.compile(
        r"^\s*(import plotly\.graph_objects|from plotly(\.subplots|\.graph_objects)? import)", re.M
    )
    wrong = []
    for package in ("activations", "probes", "viewer", "goalprobe"):
        for folder, _, files in os.walk(os.path.join(root, package)):
            if os.path.join("viewer", "figures") in folder:
                continue
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as fh:
                        if drawing.search(fh.read()):
                            wrong.append(os.path.relpath(path, root))
    assert wrong == []


def test_a_folder_of_runs_is_served_with_an_agent_picker(run_dir, tmp_path):
    from goalprobe.viewer.app import create_multi_run_app
    from goalprobe.viewer.data import find_runs

    parent = tmp_path / "agents"
    parent.mkdir()
    for name in ("agent-a", "agent-b"):
        (parent / name).symlink_to(run_dir, target_is_directory=True)
    (parent / "notes").mkdir()  # not a run: ignored
    assert list(find_runs(parent)) == ["agent-a", "agent-b"]
    assert list(find_runs(run_dir)) == [run_dir.name]
    server, apps = create_multi_run_app(parent)
    assert set(apps) == {"agent-a", "agent-b"}
    client = server.test_client()
    root = client.get("/")
    assert root.status_code == 302 and root.headers["Location"].endswith("/agent-a/")
    assert client.get("/agent-b/").status_code == 200
    layout = client.get("/agent-b/_dash-layout").get_data(as_text=True)
    assert "gp-agents" in layout and "agent-a" in layout
    current = json.loads(layout)["props"]["children"][3]["props"]["children"][2]
    links = current["props"]["children"][1:]
    assert [x["props"]["className"] for x in links] == ["", "current"]
    with pytest.raises(FileNotFoundError):
        create_multi_run_app(parent / "notes")


def test_explorer_places_agent_and_goal_with_the_position_readout(run_dir, tmp_path):
    # one read-out (issue 29): where a decoded-map file carries the position probes' read-out,
    # the explorer's decoded agent and goal are its top cells, as scoring places them, not the
    # cell probe's argmax P(AGENT) / P(GOAL)
    import shutil

    from goalprobe.probes.decoded_maps import (
        POSITION_READOUT,
        Readout,
        read_decoded_maps,
        write_decoded_maps,
    )
    from goalprobe.probes.scoring.belief import top_cells
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.step import build_step_view

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "probes" / "decoded" / "linear_pre_L5.h5"
    full = read_decoded_maps(path)
    assert full.agent is None  # the fixture's linear maps: the cell probe's channels only
    n = len(full.row_ids)
    # a read-out that puts the agent at (0, 1) and the goal at (1, 0) on every map: wrong, but
    # told apart from the cell probe's channels, whose argmax follows the true cells
    agent = np.full((n, 15, 15), 1e-4, dtype=np.float32)
    goal = agent.copy()
    agent[:, 0, 1] = goal[:, 1, 0] = 0.9
    readout = Readout(agent=POSITION_READOUT, goal=POSITION_READOUT)
    write_decoded_maps(path, full.probs, full.row_ids, full.card, agent=agent, goal=goal,
                       readout=readout)  # fmt: skip
    before = build_step_view(RunData(run_dir), list(RunData(run_dir).episodes)[0], 0,
                             map_source="linear_pre_L5")  # fmt: skip
    opened = RunData(copy)
    key = list(opened.episodes)[0]
    view = build_step_view(opened, key, 0, map_source="linear_pre_L5")
    maps = opened.decoded_maps("linear_pre_L5", key)
    probs, agent_t, goal_t = maps.decoded_parts(0)
    size = view.size
    assert view.decoded.agent_row_col == (0, 1) and view.decoded.goal_row_col == (1, 0)
    # the scoring's placement on the same read-out agrees; the cell probe's channels did not
    assert view.decoded.agent_row_col == top_cells(probs, size, CellType.AGENT, 1, agent_t)[0]
    assert view.decoded.goal_row_col == top_cells(probs, size, CellType.GOAL, 1, goal_t)[0]
    assert before.decoded.agent_row_col == top_cells(probs, size, CellType.AGENT, 1)[0]
    assert before.decoded.agent_row_col != (0, 1)
    assert view.decoded.readout == "position probes" and before.decoded.readout == "cell probe"
    # the decoded picture draws the one agent and the one goal where the read-out puts them
    assert view.decoded.argmax[0, 1] == int(CellType.AGENT)
    assert (view.decoded.argmax == int(CellType.AGENT)).sum() == 1
    assert maps.readout.agent == POSITION_READOUT


def test_step_view_carries_the_lens_of_the_steps_the_decision_stage_read(run, run_dir):
    from goalprobe.probes.decision_steps import read_decision_steps
    from goalprobe.viewer.step import build_step_view
    from goalprobe.viewer.widgets import NO_LENS

    lens_file = read_decision_steps(run_dir / "decision" / "steps.jsonl")
    key = list(run.episodes)[0]
    data = run.episode(key)
    for t, record in enumerate(data.steps):
        view = build_step_view(run, key, t)
        expected = lens_file.steps.get((record.grid_id, record.episode, record.step))
        if expected is None:
            assert view.lens is None and view.lens_why == NO_LENS
        else:
            assert view.lens.key == expected.key and view.lens_why is None
            assert np.array_equal(view.lens.answer, expected.answer)
            # the chunks' texts are the reasoning, cut at the chunk boundaries
            assert "".join(c.text for c in view.lens.chunks) == record.reasoning
    assert build_step_view(run, key, len(data.steps) - 1).lens is None
    other = list(run.episodes)[1]
    assert build_step_view(run, other, 0).lens_why == NO_LENS


def test_headline_maps_are_listed_apart_and_shown_first(run_dir, tmp_path):
    # the headline maps (role "headline": the decoder's maps scoring uses, agent and goal from
    # the position probes) share stage, layer and family with the probe sweep's maps; listed
    # under their own family, they are selectable and the explorer opens on them
    import shutil

    from goalprobe.probes.decoded_maps import read_decoded_maps, write_decoded_maps
    from goalprobe.viewer.data import RunData
    from goalprobe.viewer.run_files import HEADLINE_FAMILY
    from goalprobe.viewer.step import build_step_view, default_map_source

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    full = read_decoded_maps(copy / "probes" / "decoded" / "mlp_pre_L5.h5")
    assert full.agent is not None  # the fixture's mlp maps carry the position read-out
    write_decoded_maps(
        copy / "probes" / "decoded" / "headline_pre_reasoning_L5.h5",
        full.probs,
        full.row_ids,
        full.card,
        agent=full.agent,
        goal=full.goal,
        readout=full.readout,
        role="headline",
        trained_on="probing",
    )
    opened = RunData(copy)
    source = opened.map_sources["headline_pre_reasoning_L5"]
    assert source.family == HEADLINE_FAMILY and opened.map_sources["mlp_pre_L5"].family == "mlp"
    assert default_map_source(opened) == "headline_pre_reasoning_L5"
    key = list(opened.episodes)[0]
    view = build_step_view(opened, key, 0, map_source="headline_pre_reasoning_L5")
    assert view.decoded.readout == "position probes"
    assert default_map_source(RunData(run_dir)) == "mlp_pre_L5"  # no headline maps: as before
