"""The wall read-out of one store, stage and layer in both frames, with its verdict and power:
what the probes stage writes (one call, JSON-ready; the stage does the I/O).

    result = wall_readout(data, split, power=json.loads(wall_power_json)["conditional"])

``result["frames"][frame]`` holds the conditional test (:func:`goalprobe.probes.wall_test
.conditional_wall_test`: bits per prior-uncertain cell, within-grid AUC and accuracy, probe and
same-size-and-density null, by ring in the agent frame) and ``result["verdicts"][frame]`` the
verdict a headline prints (:func:`wall_verdict`): ``"yes"`` (detected), ``"no"`` (not
detected, and the power curve shows this design detects an effect the interval excludes) or
``"undecided"`` (not detected, and no power shown that would make a "no" mean anything).
"""

from __future__ import annotations

import numpy as np
from goalprobe.probes.probe_sweep import ProbeData
from goalprobe.probes.splits import GridSplit
from goalprobe.probes.wall_test import Frame, WallTestConfig, conditional_wall_test, wall_inputs

from goalprobe.stats import Estimate

WALL_READOUT_SCHEMA = "goalprobe.wall_readout/1"
"""``schema`` of :func:`wall_readout`'s result."""


def wall_verdict(overall: dict, power: dict | None) -> dict:
    """The verdict of one frame's test (its ``overall`` block) with the power it stands on (that
    frame's :func:`~goalprobe.probes.wall_planting.wall_power_curve`, or None): ``"no"`` only
    when the design detects planted walls at some strength and the bits interval lies below
    that effect. Returns ``{verdict, detected, bits, minimum_detectable_strength,
    minimum_detectable_bits, reason}``.
    """
    bits = overall["bits"]["difference"]
    mds = None if power is None else power.get("minimum_detectable_strength")
    mdb = None if power is None else power.get("bits_at_mds")
    if overall["detected"]:
        verdict, reason = "yes", "bits and within-grid AUC intervals above the null"
    elif mds is None or mdb is None:
        verdict, reason = "undecided", "not detected, and no detectable strength shown"
    elif Estimate.from_dict(bits).below(mdb):
        verdict, reason = "no", "not detected; the interval excludes the minimum detectable effect"
    else:
        verdict, reason = "undecided", "not detected; the interval reaches the detectable effect"
    return {
        "verdict": verdict,
        "detected": bool(overall["detected"]),
        "bits": bits,
        "minimum_detectable_strength": mds,
        "minimum_detectable_bits": mdb,
        "reason": reason,
    }


def design_power(committed: dict | None, n_grids: int, n_test_grids: int, n_features: int):
    """The committed power curves (the whole ``probes/wall_power.json``) where they apply to a
    store: ``(conditional.frames or None, {applies, reason, design})``. They apply when the
    store has at least the design's grids and test grids and its feature width
    (``n_anchors * d_model``); otherwise its verdicts get no power (a "no" reads "undecided").
    """
    if not committed or "conditional" not in committed:
        return None, {"applies": False, "reason": "no committed power curve", "design": None}
    design = committed.get("design") or {}
    want_grids = int(design.get("n_grids", 0))
    want_test = int(round(want_grids * float(design.get("test_fraction", 0.0))))
    want_features = int(design.get("d_model", 0)) * int(design.get("n_anchors", 0))
    reasons = []
    if n_grids < want_grids or n_test_grids < want_test:
        reasons.append(
            f"{n_grids} grids ({n_test_grids} held out) against the design's {want_grids} "
            f"({want_test})"
        )
    if n_features != want_features:
        reasons.append(f"{n_features} features per row against the design's {want_features}")
    info = {
        "applies": not reasons,
        "reason": "; ".join(reasons) or "the store meets the power design",
        "design": {"n_grids": want_grids, "n_test_grids": want_test, "n_features": want_features},
    }
    return (None if reasons else committed["conditional"]["frames"]), info


def wall_readout(
    data: ProbeData,
    split: GridSplit,
    *,
    frames: tuple[Frame, ...] = ("absolute", "agent"),
    config: WallTestConfig = WallTestConfig(),
    power: dict | None = None,
    fitted: dict | None = None,
) -> dict:
    """Both frames' conditional wall tests on ``data`` (split by grid) and their verdicts.

    ``config``'s ``frame`` is set per frame; ``power``: the power curves by frame
    (:func:`design_power`; None: every "no" is "undecided"); ``fitted`` receives each frame's
    fitted probe. Returns JSON-ready ``{schema, stage, layer, n_train_grids, n_test_grids,
    frames: {frame: test}, verdicts: {frame: wall_verdict}}``.
    """
    X = wall_inputs(data.acts, data.grid_sizes, data.densities, data.agent_row_col)
    out: dict = {
        "schema": WALL_READOUT_SCHEMA,
        "stage": data.source.stage,
        "layer": data.source.layer,
        "n_train_grids": int(np.unique(data.grid_ids[split.train]).size),
        "n_test_grids": int(np.unique(data.grid_ids[split.test]).size),
        "frames": {},
        "verdicts": {},
    }
    for frame in frames:
        cfg = WallTestConfig(**{**config.__dict__, "frame": frame})
        res = conditional_wall_test(X, data.cell_types, data.grid_ids, split.train, split.test, cfg)
        out["frames"][frame] = {k: v for k, v in res.items() if k not in ("probe", "null")}
        if fitted is not None:
            fitted[frame] = res["probe"]
        curve = None if power is None else power.get(frame)
        out["verdicts"][frame] = wall_verdict(res["overall"], curve)
    return out
