# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Score an agent against its decoded belief
#
# The study's belief scoring: is each action optimal on the true grid (Acc. GT), and on the
# grid a probe decodes from the agent's own residual stream (Acc. Dec.)? Recovery is the share
# of the agent's true-suboptimal actions that are optimal under its decoded map; MEG (maximum
# entropy goal-directedness) is computed on both grids. Each belief score is set against the
# same score on uninformative maps (the nulls): a map that carries no information about the
# step must score no lower.
#
# With nothing but the public API (`import goalprobe as gp`), on a handful of 7 x 7 grids:
#
# 1. rollouts of the bundled agent, in a run directory (`gp.RunLayout` names every path);
# 2. the pre-reasoning anchors of every step in an activation store;
# 3. a cell-type probe fitted on some grids, whose decoded maps of the other grids are scored
#    (`gp.score_run`, as `goalprobe score RUN` does).
#
# The tiny scale keeps it under a minute on one core; the numbers are for reading the API,
# not for conclusions. Run it as a script (`python examples/score_against_belief.py`) or open
# it as a notebook with jupytext. `GOALPROBE_EXAMPLE_OUT` names the run directory (a temporary
# one otherwise).

# %%
import json
import os
import tempfile
from pathlib import Path

import goalprobe as gp

OUT = Path(os.environ.get("GOALPROBE_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="goalprobe-"))
layout = gp.RunLayout(OUT)
print(f"goalprobe {gp.__version__}; run directory {layout.root}")

# %% [markdown]
# ## Behaviour: rollouts on the true grid
# Sixteen grids at two densities, one sampled episode each at the study's horizon
# `ceil(1.5 L)`; every step records the prompt and generated token ids, the action and the
# optimal actions `pi*(s_t)`.

# %%
grids = gp.generate_grid_set(gp.GridSetConfig(sizes=(7,), densities=(0.2, 0.6), n_per_cell=8))
layout.grids.parent.mkdir(parents=True, exist_ok=True)
gp.write_grid_set(layout.grids, grids)
model, tokenizer = gp.load_bundled_agent()
layout.trajectories.parent.mkdir(parents=True, exist_ok=True)
rollouts = gp.run_rollouts(
    grids,
    gp.LocalBackend(model, tokenizer),
    gp.RolloutConfig(episodes_per_grid=1, batch_size=16, max_new_tokens=128),
    layout.trajectories,
    progress=False,
)
print(f"{rollouts.episodes_run} episodes, {rollouts.steps} steps, {rollouts.successes} reached G")

# %% [markdown]
# ## The agent's anchors at every step
# Each recorded step is replayed teacher-forced (the exact token ids) and its pre-reasoning
# anchors stored, joined to the step by `(run_id, grid_id, episode, step)`.

# %%
capture = gp.make_backend("hooks", model, tokenizer)
layers = gp.default_layers(capture.n_layers)
layer = layers[len(layers) // 2]
layout.store.parent.mkdir(parents=True, exist_ok=True)
gp.extract(
    layout.trajectories,
    layout.store,
    capture,
    tokenizer,
    gp.ExtractConfig(layers=(layer,), stages=("pre_reasoning",)),
    model_id="bundled",
)

# %% [markdown]
# ## A decoded map of every held-out step
# The probe trains on half the grids; its decoded maps of the other half's steps go to
# `RUN/probes/decoded/`, where scoring finds them (nothing is scored on a training grid).

# %%
sweep = gp.run_probe_sweep(
    gp.StoreProbeLoader(layout.store),
    gp.ProbeSweepConfig(layers=(layer,), test_fraction=0.5, n_bootstrap=200),
    gp.CoordinateCellProbe(family="mlp", hidden_size=64, max_epochs=10),
    out_dir=layout.decoded_dir.parent,
)
print(f"decoded maps: {[p.name for p in layout.decoded_maps()]}")

# %% [markdown]
# ## Policy against belief, and MEG

# %%
scores = gp.score_run(layout, gp.ScoreConfig(n_bootstrap=200))
(probe,) = scores.belief["probes"].values()
overall, excess = probe["overall"], probe["excess"]


def stat(entry):
    """``value [low, high]`` of a ``{value, ci_low, ci_high}`` entry."""
    if entry is None or entry.get("value") is None:
        return "undefined"
    low, high = entry.get("ci_low"), entry.get("ci_high")
    interval = "" if low is None else f" [{low:.1%}, {high:.1%}]"
    return f"{entry['value']:.1%}{interval}"


print(f"steps scored: {probe['n_steps']} on {probe['n_grids']} held-out grids")
for name in ("acc_gt", "acc_dec", "recovery"):
    print(f"{name}: {stat(overall[name])}")
for name in ("acc_dec", "recovery"):
    beyond = excess.get(name)
    if beyond is not None:
        verdict = "yes" if beyond.get("above_baseline") else "no"
        print(f"{name} minus its strongest null ({beyond['baseline']}): {stat(beyond)}; "
              f"above it: {verdict}")  # fmt: skip
meg = scores.meg["overall"]["true"]["meg"]
print(
    f"MEG on the true grid: {meg['value']:.3f} nats over {scores.meg['overall']['n_grids']} grids"
)

# %%
(layout.root / "belief_summary.json").write_text(
    json.dumps(
        {
            "steps": probe["n_steps"],
            "grids": probe["n_grids"],
            "acc_gt": overall["acc_gt"],
            "acc_dec": overall["acc_dec"],
            "recovery": overall["recovery"],
            "true_meg": meg,
            "outputs": sorted(str(p.relative_to(layout.root)) for p in scores.outputs.values()),
        },
        indent=2,
    )
    + "\n"
)
print(f"summary: {layout.root / 'belief_summary.json'}")
