# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Probe an agent's anchors
#
# Before the agent reasons, its prompt ends at the *pre-reasoning anchors* (three harmony
# tokens). What do the residual streams there hold about the grid it was shown? This example
# asks the bundled agent, on a handful of 7 x 7 grids, with nothing but the public API
# (`import goalprobe as gp`):
#
# 1. a grid set, and the agent's prompt at a few states of each grid (no generation needed:
#    the anchors depend on the prompt alone);
# 2. the anchors' residual streams in an activation store;
# 3. position probes (where are the agent and the goal?) and a cell-type probe (the cognitive
#    map), each against its strongest control, on grids held out from training.
#
# The tiny scale keeps it under a minute on one core; the numbers are for reading the API,
# not for conclusions (`goalprobe demo` runs the study's protocol). Run it as a script
# (`python examples/probe_anchors.py`) or open it as a notebook with jupytext.
# `GOALPROBE_EXAMPLE_OUT` names the output folder (a temporary one otherwise).

# %%
import json
import os
import tempfile
from pathlib import Path

import numpy as np

import goalprobe as gp

OUT = Path(os.environ.get("GOALPROBE_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="goalprobe-"))
OUT.mkdir(parents=True, exist_ok=True)
print(f"goalprobe {gp.__version__}; writing to {OUT}")

# %% [markdown]
# ## Grids and prompt-only states
# Twenty 7 x 7 grids at two obstacle densities, and the agent's prompt at four states of each
# (the start state, then other cells from which the goal is reachable).

# %%
grids = gp.generate_grid_set(gp.GridSetConfig(sizes=(7,), densities=(0.0, 0.4), n_per_cell=10))
model, tokenizer = gp.load_bundled_agent()
states = gp.write_prompt_states(
    grids,
    lambda messages, effort: gp.encode_prompt(tokenizer, messages, effort),
    gp.PromptStatesConfig(states_per_grid=4),
    OUT / "states.jsonl",
    backend_description={"model": "bundled"},
)
print(f"{len(grids)} grids, {states.states_written} prompt-only states")

# %% [markdown]
# ## The anchors' residual streams
# The extraction replays every prompt and stores the output of the chosen decoder blocks at
# the three anchor tokens (`(N, 3, d_model)` per layer) with the state's labels.

# %%
capture = gp.make_backend("hooks", model, tokenizer)
layers = gp.default_layers(capture.n_layers)
extracted = gp.extract(
    OUT / "states.jsonl",
    OUT / "anchors.h5",
    capture,
    tokenizer,
    gp.ExtractConfig(layers=layers, stages=("pre_reasoning",)),
    model_id="bundled",
)
with gp.ActivationStore(OUT / "anchors.h5") as store:
    print(f"store: {extracted.rows} rows, layers {store.layers}, stages {store.stages}")
layer = layers[len(layers) // 2]  # the middle stored layer, as the demo's headline

# %% [markdown]
# ## Where are the agent and the goal?
# A logistic regression per coordinate, fitted on the training grids and scored on held-out
# grids (split by grid, never by row), against the most frequent position for the grid's size,
# a uniform guess among open cells and the same probe trained on shuffled positions.

# %%
loader = gp.StoreProbeLoader(OUT / "anchors.h5")
data = loader("pre_reasoning", layer)
split = gp.split_by_grid(data.grid_ids, test_fraction=0.3, random_state=0)
test = np.zeros(len(data.grid_ids), dtype=bool)
test[split.test] = True  # rows of the test grids
positions = gp.position_scores(data, test, n_boot=200)
for target in ("agent", "goal"):
    result = positions[target]
    probe = result["models"]["probe"]["top1"]
    versus = result["selectivity"]["top1"]
    print(
        f"{target} position, top-1: probe {probe['value']:.0%} "
        f"[{probe['ci_low']:.0%}, {probe['ci_high']:.0%}] on {result['n_grids']} test grids; "
        f"above {versus['baseline']}: {'yes' if versus['above_baseline'] else 'no'}"
    )

# %% [markdown]
# ## The cognitive map
# The study's coordinate-conditioned probe (`[activation, row, col] -> cell type`) with its
# controls: the per-cell priors by grid size (and density), shuffled labels, the majority class.

# %%
sweep = gp.run_probe_sweep(
    loader,
    gp.ProbeSweepConfig(layers=(layer,), test_fraction=0.3, n_bootstrap=200),
    gp.CoordinateCellProbe(family="linear", max_epochs=5),
    out_dir=OUT / "probes",
)
(run,) = sweep["runs"]
accuracy = run["metrics"]["models"]["probe"]["accuracy_no_padding"]
versus = run["metrics"]["selectivity"]["accuracy_no_padding"]
print(
    f"cell types, accuracy: probe {accuracy['value']:.1%} "
    f"[{accuracy['ci_low']:.1%}, {accuracy['ci_high']:.1%}]; "
    f"above {versus['baseline']}: {'yes' if versus['above_baseline'] else 'no'}"
)

# %%
summary = {
    "layer": int(layer),
    "states": states.states_written,
    "positions": {t: positions[t]["models"]["probe"]["top1"] for t in ("agent", "goal")},
    "cell_accuracy": accuracy,
    "cell_strongest_control": versus["baseline"],
}
(OUT / "anchors_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"summary: {OUT / 'anchors_summary.json'}")
