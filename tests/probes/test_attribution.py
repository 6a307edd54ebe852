"""Attribution patching (issue 41, items 2-3) on the bundled agent: the coordinates the
reasoning writes, the two metrics, exact zeros where nothing can change, site sums that predict
the single-block site patches in the linear regime, and the comparison with real patches
checked on constructed data where it must say "agrees" and where it must not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from goalprobe.activations.capture import make_backend
from goalprobe.gridworld.generator import generate_grid
from goalprobe.probes.attribution import (
    AttributionConfig,
    PairAttribution,
    attribute_pairs,
    coordinate_positions,
    counterfactual_ids,
    metric_specs,
    site_estimates,
)
from goalprobe.probes.attribution_check import compare, first_affected, site_effects
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs
from goalprobe.probes.patching.sites import ActionTokens


@pytest.fixture(scope="module")
def prepared(bundled_agent):
    """Disjoint agent- and goal-move pairs on two 5x5 grids, greedy reasoning, optimal."""
    model, tokenizer = bundled_agent
    backend = make_backend("hooks", model, tokenizer)
    rng = np.random.default_rng(0)
    bases = [base_from_grid(generate_grid(5, 0.5, rng, grid_id=f"g{i}")) for i in range(2)]
    pairs = build_counterfactuals(bases, CounterfactualConfig(control_per_move=0))
    context = PatchingContext(backend, PatchConfig(reasoning="greedy", max_new_tokens=160))
    kept, _ = prepare_pairs(pairs, context)
    assert len(kept) >= 2
    return backend, kept


@pytest.fixture(scope="module")
def attributions(prepared):
    backend, kept = prepared
    return attribute_pairs(kept[:2], backend, AttributionConfig())


def test_the_coordinates_the_reasoning_writes_are_found(prepared):
    backend, kept = prepared
    pair = kept[0]
    positions = coordinate_positions(pair.base.sequence, backend.tokenizer)
    ids = pair.base.sequence.token_ids[positions].tolist()
    words = [backend.tokenizer.decode([i]).strip() for i in ids]
    agent, goal = pair.pair.base.state.agent, pair.pair.base.grid.goal
    assert words == [str(x) for x in (*agent, *goal)]


def test_metrics_read_what_they_say(prepared):
    backend, kept = prepared
    pair = kept[0]
    specs = metric_specs(pair, backend.tokenizer, ActionTokens.from_tokenizer(backend.tokenizer),
                         ("action", "coordinates"))  # fmt: skip
    ids = pair.base.sequence.token_ids
    with torch.no_grad():
        logits = backend.model(torch.as_tensor(ids)[None]).logits[0].double()
    action = specs["action"]
    assert action is not None and pair.base.action != pair.cf.action
    read = logits[action.readouts]
    expected = read[0, action.token_ids[0]] - read[1, action.token_ids[1]]
    assert float(action(read)) == pytest.approx(float(expected))
    coords = specs["coordinates"]
    logp = torch.log_softmax(logits, -1)
    positions = coordinate_positions(pair.base.sequence, backend.tokenizer)
    expected = sum(float(logp[p - 1, ids[p]]) for p in positions)
    assert float(coords(logits[coords.readouts])) == pytest.approx(expected)


def test_attribution_is_exactly_zero_where_no_patch_can_act(prepared, attributions):
    _, kept = prepared
    by_pair = {p.pair.pair_id: p for p in kept}
    assert {a.metric for a in attributions} == {"action", "coordinates"}
    for a in attributions:
        first = first_affected(by_pair[a.pair_id])
        assert np.all(a.atp[:, a.positions < first] == 0)
        assert np.any(a.atp[:, a.positions >= first] != 0)
        # the last block's output at a prompt position reaches no later position
        assert np.all(a.atp[-1] == 0)
        assert a.graddrop is not None and np.all(a.graddrop >= 0)
        assert a.total_effect != 0
        ids = counterfactual_ids(by_pair[a.pair_id])
        assert np.array_equal(
            ids[a.prompt_length :], by_pair[a.pair_id].base.sequence.token_ids[a.prompt_length :]
        )


def test_site_sums_predict_the_anchor_site_patches_in_the_linear_regime(prepared, attributions):
    backend, kept = prepared
    action_tokens = ActionTokens.from_tokenizer(backend.tokenizer)
    checked = 0
    for a in attributions:
        pair = next(p for p in kept if p.pair.pair_id == a.pair_id)
        spec = metric_specs(pair, backend.tokenizer, action_tokens, (a.metric,))[a.metric]
        estimate = site_estimates(a, pair, ("pre_reasoning",))["pre_reasoning"]
        real = site_effects(pair, backend, spec, a.layers, ("pre_reasoning",))["pre_reasoning"]
        assert real[-1] == pytest.approx(0.0, abs=1e-6) and estimate[-1] == 0
        for e, r in zip(estimate, real, strict=True):
            if abs(r) > 1e-4:  # effects small enough to be linear: within 25%
                assert e == pytest.approx(r, rel=0.25)
                checked += 1
    assert checked >= 2


def _attribution(atp: np.ndarray, graddrop=None) -> PairAttribution:
    layers, k = atp.shape
    return PairAttribution(
        pair_id="p", grid_id="g", kind="disjoint", moved="agent", metric="action",
        layers=tuple(range(layers)), positions=np.arange(k), atp=atp, graddrop=graddrop,
        metric_base=0.0, metric_cf=1.0, prompt_length=k, cell_positions=np.zeros((1, 1)),
        pre_reasoning=(0, 1, 2), changed_cells=((0, 0), (0, 1)),
    )  # fmt: skip


def test_compare_says_agree_on_a_faithful_estimate_and_not_on_an_unrelated_one():
    rng = np.random.default_rng(0)
    effects = rng.standard_normal((3, 60)) * rng.exponential(1.0, (3, 60))
    effects[:, :10] = 0  # before the first changed position
    faithful = compare(_attribution(0.5 * effects), effects, first=10)
    assert faithful.spearman == pytest.approx(1.0)
    assert faithful.hits_top == 5 and faithful.scale_top == pytest.approx(0.5)
    assert faithful.n_sites == 150 and faithful.random_hit_rate == pytest.approx(15 / 150)
    assert faithful.wrong_sign_top == 0
    unrelated = compare(_attribution(rng.standard_normal((3, 60))), effects, first=10)
    assert abs(unrelated.spearman) < 0.3 and unrelated.hits_top <= 2
    inverted = compare(_attribution(-effects), effects, first=10)
    assert inverted.spearman == pytest.approx(-1.0) and inverted.wrong_sign_top == 15
    # GradDrop's magnitude ranks the sites when given
    ranked = compare(_attribution(-effects, graddrop=np.abs(effects)), effects, first=10)
    assert ranked.hits_top == 5 and ranked.spearman_graddrop == pytest.approx(1.0)


def test_diagnose_names_saturation_and_cancellation_from_constructed_estimates():
    from goalprobe.probes.attribution_check import diagnose

    rng = np.random.default_rng(1)
    effects = rng.standard_normal((3, 60)) * rng.exponential(1.0, (3, 60))
    effects[:, :10] = 0

    def verdict(atp):
        a = compare(_attribution(atp), effects, first=10)
        return diagnose(a.spearman, a.scale_top, a.wrong_sign_top)

    assert verdict(effects) == "agrees"
    # saturation: the largest effects squashed (monotone, so ranks survive: still agrees) ...
    assert verdict(np.tanh(effects) * 0.1) == "agrees"
    # ... and squashed with noise in the ranks: rho falls, the top decile is under-read
    noisy = np.tanh(effects) * 0.1 + 0.05 * rng.standard_normal(effects.shape)
    assert verdict(noisy).startswith("saturation")
    # cancellation: the top effects' estimates flipped
    flipped = effects.copy()
    top = np.abs(effects) >= np.quantile(np.abs(effects[:, 10:]), 0.9)
    flipped[top] *= -1
    assert "cancellation" in verdict(flipped)
    assert diagnose(None, None, 0).startswith("constant")


def test_the_attribution_file_round_trips_and_refuses_another_version(attributions, tmp_path):
    import json

    from goalprobe.probes.attribution import read_attributions, write_attributions

    tensors, card = write_attributions(tmp_path / "a", attributions, {"model": "bundled"})
    records, meta = read_attributions(tmp_path / "a.json")
    assert meta["model"] == "bundled" and len(records) == len(attributions)
    for got, want in zip(records, attributions, strict=True):
        assert got.pair_id == want.pair_id and got.metric == want.metric
        assert np.allclose(got.atp, want.atp, rtol=1e-6, atol=1e-12)
        assert np.array_equal(got.positions, want.positions)
        assert np.array_equal(got.cell_positions, want.cell_positions)
        assert got.changed_cells == want.changed_cells
    text = json.loads(card.read_text())
    text["schema_version"] = 99
    card.write_text(json.dumps(text))
    with pytest.raises(ValueError, match="version 99"):
        read_attributions(tensors)


def test_reasoning_positions_are_attributed_when_asked(prepared):
    backend, kept = prepared
    config = AttributionConfig(metrics=("coordinates",), positions="all", grad_drop=False)
    (record,) = attribute_pairs(kept[:1], backend, config)
    sequence = kept[0].base.sequence
    assert record.atp.shape == (4, len(sequence)) and record.graddrop is None
    last_read = int(record.readouts.max())
    assert np.all(record.atp[:, last_read + 1 :] == 0)  # nothing after the last read
    reasoning = slice(sequence.reasoning_span[0], last_read + 1)
    assert np.any(record.atp[:, reasoning] != 0)


def test_regions_and_where_the_attribution_lies(prepared, attributions):
    from goalprobe.probes.attribution import REGIONS, regions, where_read

    _, kept = prepared
    a = attributions[0]
    pair = next(p for p in kept if p.pair.pair_id == a.pair_id)
    region = regions(a)
    cells = pair.base.sequence.grid.cell_positions
    for r, c in pair.pair.changed_cells:
        assert region[a.column(int(cells[r, c]))] == REGIONS.index("changed_cells")
    for p in pair.base.sequence.anchors.pre_reasoning:
        assert region[a.column(int(p))] == REGIONS.index("pre_reasoning")
    assert region[0] == REGIONS.index("instructions")
    where = where_read(attributions)
    assert set(where) == {"action", "coordinates"}
    for metric, summary in where.items():
        shares = np.asarray(summary["share_by_block"])
        assert shares.shape == (4, len(REGIONS)) and np.isclose(shares.sum(), 1.0)
        n = sum(r.metric == metric for r in attributions)
        assert summary["source"] == "graddrop" and summary["n_pairs"] == n
        # nothing before the first changed cell: the instructions carry no attribution
        assert np.all(shares[:, REGIONS.index("instructions")] < 0.05)
