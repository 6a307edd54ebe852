"""Activation patching on real tiny GPT-OSS models (random weights) with every backend.

Properties checked: patching every position of a layer with the source run reproduces the
source logits; patching positions after the readout changes nothing; the nnsight and hook
backends (with their prefix KV cache) and the TransformerLens backend agree; grid-cell tokens
are located by token ids; the experiment's metrics, filters, store source values and files
behave; ``run_experiment`` is what the CLI writes; the trained bundled agent keeps its action
under control patches.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from goalprobe.activations.capture import BACKENDS, Patch, make_backend
from goalprobe.agents.bundled import BundledModelConfig, gpt_oss_config
from goalprobe.agents.harmony import HarmonyTokenIds
from goalprobe.agents.reasoning import final_text
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.text import render
from goalprobe.probes.patching.counterfactuals import (
    BaseState,
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import (
    PatchConfig,
    PatchingContext,
    prepare_pairs,
    resolve_layer_sets,
)
from goalprobe.probes.patching.patched_runs import (
    logit_difference,
    recovered_fraction,
    run_patching,
)
from goalprobe.probes.patching.results import summarize, write_results
from goalprobe.probes.patching.run import draw_bases, run_experiment
from goalprobe.probes.patching.sites import (
    ActionTokens,
    SequenceError,
    build_sequence,
    locate_grid_tokens,
    site_positions,
)
from goalprobe.viewer.figures.patching import patch_summary_figure

from goalprobe.stages.patching import write_patch_heatmap

N_LAYERS = 3


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny_model(tokenizer):
    """A random 3-block GPT-OSS over the bundled tokenizer (seeded: same weights every call)."""
    from transformers import GptOssForCausalLM

    config = gpt_oss_config(
        BundledModelConfig(
            hidden_size=32,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=2,
            num_experts_per_tok=1,
            sliding_window=64,
        ),
        tokenizer,
    )
    config.initializer_range = 0.5  # sharp random weights: two changed cells move the logits
    torch.manual_seed(0)
    return GptOssForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """The tiny model saved as a local model directory (a fresh copy: the TransformerLens
    bridge takes over the submodules of the model it wraps, which can then not be saved)."""
    path = tmp_path_factory.mktemp("model")
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def backends(model, tokenizer):
    return {name: make_backend(name, model, tokenizer) for name in BACKENDS}


@pytest.fixture(scope="module")
def pairs():
    grids = [
        generate_grid(5, 0.5, np.random.default_rng(seed), grid_id=f"g{seed}", min_distance=2)
        for seed in range(3)
    ]
    config = CounterfactualConfig(moves=("agent", "goal"), disjoint_per_move=1, control_per_move=1)
    return build_counterfactuals([base_from_grid(g) for g in grids], config)


def patch_config(**overrides) -> PatchConfig:
    fields = dict(
        sites=("grid", "changed_cells", "pre_reasoning", "post_reasoning", "answer"),
        layers=("0", "all"),
        reasoning="oracle",
        require_optimal=False,
        max_new_tokens=6,
        batch_size=8,
    )
    fields.update(overrides)
    return PatchConfig(**fields)


def context_for(backend, **overrides) -> PatchingContext:
    return PatchingContext(backend, patch_config(**overrides))


@pytest.fixture(scope="module")
def prepared(model, tokenizer, backends, pairs):
    context = context_for(backends["nnsight"])
    # two pairs from each of two grids of one size: the random-grid control has a source
    chosen = [p for p in pairs if p.base.grid_id == "g0"][:2]
    chosen += [p for p in pairs if p.base.grid_id == "g1"][:2]
    assert {p.kind for p in chosen} == {"disjoint", "control"}
    items, report = prepare_pairs(chosen, context)
    assert report.n_kept == 4 and not report.dropped
    return context, items


# ---------------------------------------------------------------------------------------------
# token positions
# ---------------------------------------------------------------------------------------------


def test_grid_cells_are_located_in_the_user_message(prepared, tokenizer):
    context, items = prepared
    for item in items[:2]:
        side = item.base
        ids = side.sequence.token_ids
        layout = side.sequence.grid
        n = side.grid.size
        text = render(side.grid, side.state).split("\n")
        for row in range(n):
            for col in range(n):
                token = tokenizer.decode([int(ids[layout.cell_positions[row, col]])])
                assert token.strip() == text[row + 1].split(" ")[col + 1]
        start, stop = layout.span
        assert tokenizer.decode(ids[start:stop].tolist()).strip() == "\n".join(text).strip()
        # the instructions' worked example (developer message) lies before the user grid
        user = HarmonyTokenIds.from_tokenizer(tokenizer).user[0]
        assert start > int(np.flatnonzero(ids == user)[-1])
    with pytest.raises(SequenceError, match="occurs 0 times"):
        locate_grid_tokens(ids, tokenizer, "  0 1\n0 # #\n1 # #", context.special_ids)


def test_action_tokens_and_teacher_forced_sequence(prepared, tokenizer):
    context, items = prepared
    tokens = ActionTokens.from_tokenizer(tokenizer)
    for action in Action:
        ids = [*tokens.prefix_ids, tokens.action_ids[action]]
        assert tokenizer.decode(ids) == f'{{"action": "{action.name}'
    seq = items[0].base.sequence
    assert seq.token_ids[-len(tokens.prefix_ids) :].tolist() == list(tokens.prefix_ids)
    tail = tokenizer.decode(seq.token_ids[seq.anchors.post_reasoning[0] :].tolist())
    assert tail == '<|end|><|start|>assistant<|channel|>final<|message|>{"action": "'
    assert seq.anchors.pre_reasoning[2] == seq.prompt_length - 1
    # a cut-off completion (no <|end|> after the reasoning) is refused
    cut = list(items[0].base.completion_ids[:-1])
    with pytest.raises(SequenceError, match="cut off"):
        build_sequence(
            items[0].base.prompt_ids,
            cut,
            tokenizer=tokenizer,
            grid_text=render(items[0].base.grid, items[0].base.state),
            special_ids=context.special_ids,
            action_tokens=tokens,
        )


def test_site_positions_align_prompt_sites(prepared):
    _, items = prepared
    item = items[0]
    src, tgt = item.cf.sequence, item.base.sequence
    for site in ("grid", "changed_cells", "pre_reasoning"):
        s, t = site_positions(src, tgt, site, item.pair.changed_cells)
        assert np.array_equal(s, t)
    s, t = site_positions(src, tgt, "changed_cells", item.pair.changed_cells)
    assert len(s) == 2 and np.all(src.token_ids[s] != tgt.token_ids[t])
    s, t = site_positions(src, tgt, "answer")
    assert (s[0], t[0]) == (len(src) - 1, len(tgt) - 1)
    if len(src) != len(tgt):
        with pytest.raises(SequenceError, match="equal length"):
            site_positions(src, tgt, "all")


# ---------------------------------------------------------------------------------------------
# causal properties of the backends
# ---------------------------------------------------------------------------------------------


def equal_length_runs(item, context):
    """Base and counterfactual prompts, both followed by the base's reasoning: same length."""
    tokens = context.action_tokens
    sequences = []
    for side in (item.base, item.cf):
        sequences.append(
            build_sequence(
                side.prompt_ids,
                item.base.completion_ids,
                tokenizer=context.tokenizer,
                grid_text=render(side.grid, side.state),
                special_ids=context.special_ids,
                action_tokens=tokens,
            )
        )
    return sequences


@pytest.mark.parametrize("name", BACKENDS)
def test_patching_every_position_of_a_layer_reproduces_the_source(prepared, backends, name):
    context, items = prepared
    backend = backends[name]
    target, source = equal_length_runs(items[0], context)
    positions = np.arange(len(target))
    clean_source = backend.clean_run(source.token_ids, range(N_LAYERS), positions)
    clean_target = backend.clean_run(target.token_ids, range(N_LAYERS), positions)
    assert not torch.allclose(clean_source.logits, clean_target.logits, atol=1e-3)
    patches = [
        Patch((layer,), torch.as_tensor(positions), clean_source.values([layer], positions))
        for layer in range(N_LAYERS)
    ]
    patched = backend.patched_logits(target.token_ids, patches)
    for row in patched:
        torch.testing.assert_close(row, clean_source.logits, atol=1e-4, rtol=1e-4)
    # one position short (the readout kept) is no longer the source run at layer 0
    partial = Patch((0,), torch.as_tensor(positions[:-1]), clean_source.values([0], positions[:-1]))
    out = backend.patched_logits(target.token_ids, [partial])[0]
    assert not torch.allclose(out, clean_source.logits, atol=1e-4)


@pytest.mark.parametrize("name", BACKENDS)
def test_positions_after_the_readout_change_nothing(prepared, backends, name):
    context, items = prepared
    backend = backends[name]
    seq = items[0].base.sequence
    tokens = context.action_tokens
    readout = seq.readout_position
    longer = np.concatenate([seq.token_ids, [tokens.action_ids[0]], seq.token_ids[-3:]])
    after = torch.arange(readout + 1, len(longer))
    noise = torch.randn(N_LAYERS, len(after), 32, generator=torch.Generator().manual_seed(0)) * 5
    before = torch.as_tensor([readout - 5, readout])
    patches = [
        Patch(tuple(range(N_LAYERS)), after, noise),
        Patch((1,), after[:2], noise[1:2, :2]),
        Patch((0,), before, noise[0:1, :2]),
    ]
    out = backend.patched_logits(longer, patches, readout_position=readout)
    clean = backend.clean_run(seq.token_ids, [0], np.array([readout])).logits
    torch.testing.assert_close(out[0], clean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], clean, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[2], clean, atol=1e-3)


@pytest.mark.parametrize("other", ["transformer_lens", "hooks"])
def test_backends_agree_on_the_experiment(prepared, backends, other):
    context, items = prepared
    ours, _ = run_patching(items[:2], context)
    theirs, _ = run_patching(items[:2], context_for(backends[other]))
    assert len(ours) == len(theirs) == 2 * 2 * 5 * 2  # pairs x directions x sites x layer sets
    key = lambda r: (r.pair_id, r.direction, r.site, r.layers)  # noqa: E731
    theirs = {key(r): r for r in theirs}
    for r in ours:
        t = theirs[key(r)]
        assert r.patched_action == t.patched_action
        np.testing.assert_allclose(r.patched_probs, t.patched_probs, atol=1e-5)
        assert math.isclose(r.ld_patched, t.ld_patched, abs_tol=1e-4) or (
            math.isnan(r.ld_patched) and math.isnan(t.ld_patched)
        )


def test_prefix_cache_is_exact(prepared, model, tokenizer):
    context, items = prepared
    ours, _ = run_patching(items[:1], context)
    full = make_backend("nnsight", model, tokenizer, prefix_cache=False)
    ours_full, _ = run_patching(items[:1], context_for(full))
    assert len(ours_full) == len(ours)
    for a, b in zip(ours[: len(ours_full)], ours_full, strict=True):
        np.testing.assert_allclose(a.patched_probs, b.patched_probs, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the experiment's metrics
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def records(prepared):
    context, items = prepared
    out, skipped = run_patching(items, context)
    assert not skipped
    return out


def test_records_metrics_are_consistent(prepared, records):
    context, items = prepared
    by_pair = {item.pair.pair_id: item for item in items}
    others = {item.base.sequence.prompt_length: item for item in items}
    for r in records:
        item = by_pair[r.pair_id]
        source, target = item.sides(r.direction)
        reference = source.optimal
        if r.kind == "random_grid":  # a base side of the other grid, scored against the pair's
            assert item.pair.kind == "disjoint" and r.site != "changed_cells"
            assert r.base_id == item.pair.base.base_id
            source = next(i.base for i in items if i.pair.base.grid_id != r.grid_id)
            assert r.source_optimal == sorted(a.name for a in source.optimal)
        probs = np.asarray(r.patched_probs)
        assert probs.shape == (4,) and math.isclose(probs.sum(), 1.0, rel_tol=1e-6)
        assert r.patched_action == Action(int(np.argmax(probs))).name
        assert not r.invalid
        assert r.target_action == target.action.name and r.source_action == source.action.name
        assert r.action_changed == (r.patched_action != r.target_action)
        assert r.into_source_optimal == (Action[r.patched_action] in source.optimal)
        assert r.into_reference_optimal == (Action[r.patched_action] in reference)
        if r.kind == "random_grid":
            assert math.isnan(r.recovered)
            continue
        if r.kind == "control":
            assert r.ld_target == 0.0 and math.isnan(r.recovered)
            assert r.into_source_optimal == r.in_target_optimal
        else:
            assert math.isclose(
                r.ld_target, logit_difference(target.action_logits, source.optimal, target.optimal)
            )
        if r.site == "answer" and r.layers == "all":
            # the readout's residual after the last block is the source's: logits are too
            assert r.patched_action == r.source_action
            if r.kind == "disjoint":
                assert math.isclose(r.recovered, 1.0, abs_tol=1e-4) or math.isnan(r.recovered)
    assert {r.site for r in records} == set(context.config.sites)
    assert {r.kind for r in records} == {"disjoint", "control", "random_grid"}
    assert len(others) == 1  # one prompt length: every disjoint pair had a random source


def test_logit_difference_and_recovered_fraction():
    logits = np.array([2.0, 0.0, 1.0, -1.0])
    up, down, left = frozenset({Action.UP}), frozenset({Action.DOWN}), frozenset({Action.LEFT})
    assert logit_difference(logits, up, down) == 2.0
    both = frozenset({Action.UP, Action.LEFT})
    assert math.isclose(logit_difference(logits, both, down), math.log(math.e**2 + math.e))
    assert math.isclose(recovered_fraction(1.0, 0.0, 2.0), 0.5)
    assert math.isnan(recovered_fraction(1.0, 0.5, 0.5))
    assert math.isnan(logit_difference(logits, frozenset(), left))


def test_optimality_filter_drops_exactly_the_suboptimal_pairs(
    prepared, model, tokenizer, backends, pairs
):
    _, items = prepared
    context = context_for(backends["nnsight"], require_optimal=True)
    kept, report = prepare_pairs(pairs[:4], context)
    expected = [
        i.pair.pair_id
        for i in items
        if i.base.action in i.base.optimal and i.cf.action in i.cf.optimal
    ]
    assert [k.pair.pair_id for k in kept] == expected
    assert report.dropped.get("not optimal before patching", 0) == 4 - len(expected)


def test_pairs_whose_greedy_reasoning_was_cut_are_reported_as_truncated(backends, pairs):
    # the random model never stops within 6 tokens: every greedy completion is cut off
    context = context_for(backends["nnsight"], reasoning="greedy", regenerate=False)
    kept, report = prepare_pairs(pairs[:4], context)
    assert kept == [] and report.n_pairs == 4
    assert report.dropped_truncated == 4 == sum(report.dropped.values())
    assert all("truncated" in reason and "(6)" in reason for reason in report.dropped)
    assert report.to_dict()["dropped_truncated"] == 4
    # a regenerated completion that used the whole budget names no action, whatever it says
    ids = list(context.tokenizer('<|channel|>final<|message|>{"action": "UP", "x')["input_ids"])
    context = context_for(backends["nnsight"], max_new_tokens=len(ids))
    assert context.parse_generated(ids) is None
    longer = context_for(backends["nnsight"], max_new_tokens=len(ids) + 1)
    assert longer.parse_generated(ids) == Action.UP


def test_draw_bases_keeps_sizes_then_draws_in_order():
    grids = [
        generate_grid(size, 0.5, np.random.default_rng(seed), grid_id=f"d{size}_{seed}")
        for size in (5, 7)
        for seed in range(4)
    ]
    bases = [base_from_grid(g) for g in grids]
    drawn = draw_bases(bases, 3, random_state=1, sizes=[7])
    assert len(drawn) == 3 and all(b.grid.size == 7 for b in drawn)
    order = [bases.index(b) for b in drawn]
    assert order == sorted(order) and drawn == draw_bases(bases, 3, 1, sizes=[7])
    assert draw_bases(bases, 10) == bases and draw_bases(bases, 8, sizes=[9]) == []


def test_resolve_layer_sets():
    assert resolve_layer_sets(["thirds", "all"], 24) == [
        ("7", (7,)),
        ("15", (15,)),
        ("23", (23,)),
        ("all", tuple(range(24))),
    ]
    assert resolve_layer_sets(["each", "1", "-1", "0+2"], 3) == [
        ("0", (0,)),
        ("1", (1,)),
        ("2", (2,)),
        ("0+2", (0, 2)),
    ]
    # the dose-response: single blocks, then the first k and the last k, then every block
    assert [label for label, _ in resolve_layer_sets(["each", "cumulative"], 4)] == [
        "0", "1", "2", "3", "first2", "last2", "first3", "last3", "all",
    ]  # fmt: skip
    assert dict(resolve_layer_sets(["cumulative"], 4))["last3"] == (1, 2, 3)
    assert [label for label, _ in resolve_layer_sets(["cumulative"], 2)] == ["0", "1", "all"]
    with pytest.raises(ValueError, match="outside"):
        resolve_layer_sets(["3"], 3)
    with pytest.raises(ValueError, match="bad layer spec"):
        resolve_layer_sets(["middle"], 3)


def test_regenerated_outcomes_patch_prompt_sites_only(prepared, model, tokenizer, backends, pairs):
    context = context_for(
        backends["nnsight"],
        regenerate=True,
        directions=("cf_to_base",),
        layers=("all",),
    )
    items, _ = prepare_pairs(pairs[:1], context)
    records, _ = run_patching(items, context)
    regenerated = [r for r in records if r.mode == "regenerated"]
    assert {r.site for r in regenerated} == {"grid", "changed_cells", "pre_reasoning"}
    assert all(math.isnan(r.ld_patched) and r.patched_probs == [] for r in regenerated)
    # generation under a patch: both backends agree, and a no-op patch changes nothing
    item = items[0]
    prompt = item.base.prompt_ids
    positions = np.arange(len(prompt))
    own = backends["nnsight"].clean_run(prompt, [1], positions)
    cf = backends["nnsight"].clean_run(item.cf.prompt_ids, [1], positions)
    patches = [
        Patch((1,), torch.as_tensor(positions), own.values([1], positions)),
        Patch((1,), torch.as_tensor(positions), cf.values([1], positions)),
    ]
    stop = list(context.special_ids.stop_ids)
    a = backends["nnsight"].generate(prompt, patches, max_new_tokens=6, stop_ids=stop)
    b = backends["transformer_lens"].generate(prompt, patches, max_new_tokens=6, stop_ids=stop)
    c = backends["hooks"].generate(prompt, patches, max_new_tokens=6, stop_ids=stop)
    assert a == b == c
    unpatched = context.generator.model.generate(
        torch.as_tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=stop
    )[0, len(prompt) :].tolist()
    assert a[0] == unpatched[: len(a[0])]
    # pooled regeneration: one equal-length prompt per patch gives what each prompt alone gives
    prompts = np.asarray([prompt, item.cf.prompt_ids])
    for name in ("nnsight", "hooks", "transformer_lens"):
        pooled = backends[name].generate(prompts, patches, max_new_tokens=6, stop_ids=stop)
        alone = [
            backends[name].generate(row, [patch], max_new_tokens=6, stop_ids=stop)[0]
            for row, patch in zip(prompts, patches, strict=True)
        ]
        assert pooled == alone, name
    with pytest.raises(ValueError, match="one equal-length prompt per patch"):
        backends["hooks"].generate(prompts[:1], patches, max_new_tokens=2, stop_ids=stop)


def test_sanity_pairs_patch_the_whole_input_beyond_the_full_tier(backends, pairs):
    """Pairs outside the dose-response tier still get the input sanity check (every block at
    the grid, teacher-forced and regenerated), the first ``sanity_pairs`` disjoint ones only."""
    context = context_for(
        backends["nnsight"],
        regenerate=True,
        directions=("cf_to_base",),
        layers=("0",),
        anchor_layers=("all",),
        full_pairs=0,
        sanity_pairs=1,
    )
    items, _ = prepare_pairs(pairs, context)
    records, skipped = run_patching(items, context)
    grid = [r for r in records if r.site == "grid"]
    first = next(i.pair.pair_id for i in items if i.pair.kind == "disjoint")
    assert {r.pair_id for r in grid} == {first} and {r.layers for r in grid} == {"all"}
    assert {r.mode for r in grid} == {"teacher_forced", "regenerated"}
    assert all(r.kind == "disjoint" for r in grid)
    # no sanity check without its layer set: said, not silently absent
    bare = context_for(
        backends["nnsight"], directions=("cf_to_base",), layers=("0",), anchor_layers=("0",),
        full_pairs=0, sanity_pairs=1,
    )  # fmt: skip
    items, _ = prepare_pairs(pairs, bare)
    records, skipped = run_patching(items, bare)
    assert not [r for r in records if r.site == "grid"]
    assert any(k.startswith("sanity check: no layer set 'all'") for k in skipped)


# ---------------------------------------------------------------------------------------------
# store source values and result files
# ---------------------------------------------------------------------------------------------


def write_store(path, rows, layers, d_model):
    """A real activation store with the given rows (labels filled with typed placeholders)."""
    from goalprobe.activations.store.schema import LABEL_FIELDS
    from goalprobe.activations.store.writer import RowBatch, StoreLayout, StoreWriter

    n = len(rows)
    labels = {}
    for name, spec in LABEL_FIELDS.items():
        if spec.dtype is str:
            labels[name] = np.asarray(["plain"] * n, dtype=object)
        else:
            labels[name] = np.zeros((n, *spec.shape), dtype=spec.dtype)
    for key in ("run_id", "grid_id", "episode", "step"):
        values = [row[key] for row in rows]
        labels[key] = np.asarray(values, dtype=object if key.endswith("id") else np.int32)
    stages = ("pre_reasoning", "post_reasoning")
    batch = RowBatch(
        acts={s: {x: np.stack([row[s][x] for row in rows]) for x in layers} for s in stages},
        positions={s: np.stack([row[f"{s}_positions"] for row in rows]) for s in stages},
        present={s: np.ones(n, dtype=bool) for s in stages},
        labels=labels,
    )
    with StoreWriter(path, StoreLayout(stages, tuple(layers), d_model), {"model_id": "tiny"}) as w:
        w.append(batch)


def test_store_source_values_match_live_values(tmp_path, model, tokenizer, backends, pairs):
    from goalprobe.activations.store.reader import ActivationStore
    from goalprobe.probes.patching.patched_runs import StoreSource

    backend = backends["nnsight"]
    context = context_for(
        backend,
        sites=("pre_reasoning", "post_reasoning", "grid"),
        layers=("0", "2"),
        directions=("base_to_cf",),
        reasoning="oracle",
    )
    pair = pairs[0]
    grid, state = pair.base.grid, pair.base.state
    ids = context.special_ids
    answer = tokenizer.encode(final_text(Action.UP), add_special_tokens=False)
    completion = [
        *context.oracle_completion(grid, state),  # the analysis message, closed by <|end|>
        *(ids.start, ids.assistant, ids.channel, *ids.final, ids.message),
        *answer,
        ids.return_,
    ]
    recorded = BaseState(
        grid=grid,
        state=state,
        base_id=f"run/{grid.grid_id}/0/1",
        run_id="run",
        episode=0,
        step=1,
        prompt_token_ids=tuple(context.prompt_ids(grid, state)),
        generated_token_ids=tuple(completion),
    )
    recorded_pairs = build_counterfactuals([recorded], CounterfactualConfig(control_per_move=0))
    items, report = prepare_pairs(recorded_pairs[:1], context)
    assert report.n_kept == 1
    seq = items[0].base.sequence
    row = {"run_id": "run", "grid_id": grid.grid_id, "episode": 0, "step": 1}
    for stage in ("pre_reasoning", "post_reasoning"):
        where = np.asarray(getattr(seq.anchors, stage))
        run = backend.clean_run(seq.token_ids, [0, 2], where)
        row[stage] = {x: run.values([x], where)[0].numpy() for x in (0, 2)}
        row[f"{stage}_positions"] = where
    other = {**row, "step": 5}
    path = tmp_path / "acts.h5"
    write_store(path, [other, row], [0, 2], 32)
    with ActivationStore(path) as store:
        source = StoreSource(store)
        assert source.row_of(recorded) == 1
        stored, _ = run_patching(items, context, store=source)
        live, _ = run_patching(items, context)
    origins = {(r.site, r.source_values) for r in stored}
    assert origins == {("pre_reasoning", "store"), ("post_reasoning", "store"), ("grid", "live")}
    for a, b in zip(stored, live, strict=True):
        np.testing.assert_allclose(a.patched_probs, b.patched_probs, atol=2e-3)
    # another recorded reasoning: the prompt anchor still matches, the reasoning anchor not
    other_reasoning = BaseState(**{**vars(recorded), "generated_token_ids": (1, 2, 3)})
    assert source_values_of(items, context, other_reasoning, path) == {
        ("pre_reasoning", "store"),
        ("post_reasoning", "live"),
        ("grid", "live"),
    }
    # positions that do not match the patch are an error, not silently used
    row["pre_reasoning_positions"] = row["pre_reasoning_positions"] - 1
    write_store(tmp_path / "bad.h5", [row], [0, 2], 32)
    with (
        ActivationStore(tmp_path / "bad.h5") as store,
        pytest.raises(ValueError, match="positions"),
    ):
        run_patching(items, context, store=StoreSource(store))


def source_values_of(items, context, base, path):
    """``(site, origin)`` of the source values when ``items``' base carries ``base``'s ids."""
    from dataclasses import replace

    from goalprobe.activations.store.reader import ActivationStore
    from goalprobe.probes.patching.patched_runs import StoreSource

    moved = [replace(i, pair=replace(i.pair, base=base)) for i in items]
    with ActivationStore(path) as store:
        records, _ = run_patching(moved, context, store=StoreSource(store))
    return {(r.site, r.source_values) for r in records}


def test_summary_and_files(tmp_path, records):
    summary = summarize(records, n_resamples=200)
    cells = {(r.kind, r.direction, r.site, r.layers) for r in records}
    assert len(summary) == len(cells)
    for row in summary:
        mine = [
            r
            for r in records
            if (r.kind, r.direction, r.site, r.layers)
            == (row.kind, row.direction, row.site, row.layers)
        ]
        assert row.n_runs == len(mine)
        assert math.isclose(row.action_changed_rate, np.mean([r.action_changed for r in mine]))
        low, high = row.action_changed_ci
        if row.n_grids >= 2:
            assert low <= row.action_changed_rate <= high
    paths = write_results(tmp_path / "out", records, summary, {"config": {"sites": ["grid"]}})
    bundle = json.loads(paths["results_json"].read_text())
    assert bundle["schema"] == "goalprobe.patching/2"
    assert len(bundle["records"]) == len(records) and len(bundle["summary"]) == len(summary)
    header = paths["summary_csv"].read_text().splitlines()[0]
    assert "action_changed_ci_low" in header
    assert "heatmap_html" not in paths  # the library writes tables; drawing is the viewer's
    heatmap = write_patch_heatmap(tmp_path / "out", summary)
    assert heatmap == tmp_path / "out" / "patch_heatmap.html"
    assert "plotly" in heatmap.read_text()[:5000].lower()
    fig = patch_summary_figure(bundle["summary"])  # the JSON bundle, as the report reads it
    first = min(r.direction for r in summary if r.mode == "teacher_forced")
    drawn = fig.data[0]  # first direction, "into source's optimal set (disjoint)"
    for r in summary:
        if (r.kind, r.mode, r.direction) == ("disjoint", "teacher_forced", first):
            z = drawn.z[list(drawn.y).index(r.site)][list(drawn.x).index(r.layers)]
            assert z == pytest.approx(r.into_source_optimal_rate)


def test_summary_intervals_resample_grids():
    """The summary's intervals come from the grid bootstrap of ``goalprobe.stats``."""
    from goalprobe.stats import grid_bootstrap_ratio

    def record(grid, changed, recovered):
        return {
            "kind": "disjoint", "mode": "teacher_forced", "direction": "base_to_cf",
            "site": "grid", "layers": "0", "grid_id": grid, "action_changed": changed,
            "into_source_optimal": changed, "in_target_optimal": not changed,
            "recovered": recovered, "invalid": False, "into_reference_optimal": changed,
        }  # fmt: skip

    grids = ["a", "a", "a", "a", "b", "b", "c", "c"]
    changed = [1, 1, 1, 1, 0, 0, 1, 0]
    recovered = [0.5, 1.0, math.nan, 0.0, 0.2, math.nan, 0.9, 0.1]
    records = [record(*row) for row in zip(grids, changed, recovered, strict=True)]
    (row,) = summarize(records, n_resamples=500, random_state=3)
    assert row.action_changed_rate == np.mean(changed) and row.n_grids == 3
    expected = grid_bootstrap_ratio(changed, None, grids, n_resamples=500, random_state=3)
    assert row.action_changed_ci == (expected["ci_low"], expected["ci_high"])
    assert 0.0 <= row.action_changed_ci[0] <= row.action_changed_rate <= row.action_changed_ci[1]
    defined = [i for i, v in enumerate(recovered) if not math.isnan(v)]
    assert row.n_recovered == 6
    assert math.isclose(row.recovered_mean, np.mean([recovered[i] for i in defined]))
    expected = grid_bootstrap_ratio(
        [recovered[i] for i in defined],
        None,
        [grids[i] for i in defined],
        n_resamples=500,
        random_state=3,
    )
    assert row.recovered_ci == (expected["ci_low"], expected["ci_high"])
    # one grid: no interval; a rate at 100% keeps the exact interval on its 4 grids (a
    # percentile bootstrap would print [100, 100]); a constant mean keeps a point interval
    (one,) = summarize([record("a", 1, 0.5), record("a", 0, 0.5)], n_resamples=200)
    assert all(math.isnan(v) for v in one.action_changed_ci)
    (same,) = summarize([record(g, 1, 0.5) for g in "abcd"], n_resamples=200)
    assert same.action_changed_ci == (pytest.approx(0.025**0.25), 1.0)
    assert same.recovered_ci == (0.5, 0.5)


@pytest.mark.slow  # end to end (a whole script, verb or trained agent): the full suite runs it
def test_bundled_agent_control_pairs_stay_stable(bundled_agent):
    """With the trained bundled agent, control patches keep the action."""
    model, tokenizer = bundled_agent
    grids = [
        generate_grid(7, 0.5, np.random.default_rng(seed), grid_id=f"b{seed}", min_distance=3)
        for seed in range(4)
    ]
    config = PatchConfig(layers=("each",), reasoning="oracle", require_optimal=True)
    outcome = run_experiment(
        [base_from_grid(g) for g in grids],
        make_backend("nnsight", model, tokenizer),
        config,
        CounterfactualConfig(disjoint_per_move=0),
    )
    # the trained agent acts optimally on most pairs of this seeded draw
    assert outcome.report.n_pairs >= 4 and outcome.report.n_kept >= outcome.report.n_pairs // 2
    records = outcome.records
    assert records and all(r.kind == "control" for r in records)
    assert np.mean([not r.action_changed for r in records]) >= 0.95
    assert all(r.in_target_optimal for r in records)


def plain(output: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    return " ".join(output.replace("│", " ").split())


def test_patch_command_writes_tables_and_heatmap(tmp_path, model_dir):
    import typer
    from goalprobe.gridworld.io import write_grid_set
    from typer.testing import CliRunner

    from goalprobe.commands.patch import command

    grids = [
        generate_grid(5, 0.5, np.random.default_rng(seed), grid_id=f"c{seed}", min_distance=2)
        for seed in range(3)
    ]
    write_grid_set(tmp_path / "grids.jsonl", grids)
    app = typer.Typer()
    app.command()(command)
    out = tmp_path / "out"
    args = [
        "--grids", str(tmp_path / "grids.jsonl"), "--model", str(model_dir), "--out", str(out),
        "--reasoning", "oracle", "--allow-suboptimal", "--layers", "1,all",
        "--sites", "changed_cells,answer", "--moves", "agent", "--max-bases", "2",
        "--device", "cpu", "--n-resamples", "200",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    bundle = json.loads((out / "patch_results.json").read_text())
    assert bundle["n_bases"] == 2 and bundle["backend"] == "nnsight"
    assert {r["site"] for r in bundle["records"]} == {"changed_cells", "answer"}
    assert {r["layers"] for r in bundle["records"]} == {"1", "all"}
    pairs = (out / "patch_pairs.jsonl").read_text().splitlines()
    assert len(pairs) == bundle["preparation"]["n_kept"] > 0
    assert (out / "patch_heatmap.html").stat().st_size > 10_000
    # the verb is run_experiment on the drawn bases, disjoint pairs on every base and then
    # control pairs (goalprobe.stages.patching.patch): the same records, the same summary
    from goalprobe.agents.models import load_model
    from goalprobe.gridworld.io import read_grid_set

    loaded = load_model(str(model_dir), device="cpu")
    bases = draw_bases([base_from_grid(g) for g in read_grid_set(tmp_path / "grids.jsonl")], 2)
    outcome = run_experiment(
        bases,
        make_backend("nnsight", loaded.model, loaded.tokenizer),
        PatchConfig(
            sites=("changed_cells", "answer"),
            layers=("1", "all"),
            reasoning="oracle",
            require_optimal=False,
            max_new_tokens=512,
        ),
        CounterfactualConfig(moves=("agent",)),
        pairs=build_counterfactuals(
            bases, CounterfactualConfig(moves=("agent",), control_per_move=0)
        )
        + build_counterfactuals(bases, CounterfactualConfig(moves=("agent",), disjoint_per_move=0)),
        n_resamples=200,
    )
    again = json.loads(outcome.write(tmp_path / "again")["results_json"].read_text())
    assert again["records"] == bundle["records"] and again["summary"] == bundle["summary"]
    bad = CliRunner().invoke(app, ["--out", str(out), "--model", str(model_dir)])
    assert bad.exit_code != 0 and "exactly one of --trajectories and --grids" in plain(bad.output)


def test_patch_command_on_a_trajectory_file(tmp_path, model_dir, model, tokenizer, backends):
    import typer
    from agent_fixtures import step_record
    from goalprobe.agents.trajectories import EpisodeSummary, RunHeader, record_to_json
    from typer.testing import CliRunner

    from goalprobe.commands.patch import command

    context = context_for(backends["nnsight"])
    ids = context.special_ids
    lines = [record_to_json(RunHeader("run", {"reasoning_effort": "low"}, {}, "0"))]
    for seed in range(2):
        grid = generate_grid(
            5, 0.5, np.random.default_rng(seed), grid_id=f"t{seed}", min_distance=2
        )
        state = base_from_grid(grid).state
        completion = [
            *context.oracle_completion(grid, state),
            *(ids.start, ids.assistant, ids.channel, *ids.final, ids.message),
            *tokenizer.encode(final_text(Action.UP), add_special_tokens=False),
            ids.return_,
        ]
        prompt = context.prompt_ids(grid, state)
        if seed == 1:
            bad_prompt = [*prompt[:-1], ids.start]
        step = step_record(
            grid, state, step=0, prompt_token_ids=prompt, generated_token_ids=completion
        )
        summary = EpisodeSummary(
            run_id="run", grid_id=grid.grid_id, episode=0, episode_seed=0, grid_size=grid.size,
            density=0.5, variant="plain", success=False, end_reason="horizon", length=1,
            invalid_steps=0, optimal_steps=1, total_attempts=1, horizon=3,
            shortest_path_length=2, start_row_col=grid.start, goal_row_col=grid.goal,
            final_agent_row_col=grid.start, final_has_key=False, final_door_open=True,
        )  # fmt: skip
        lines += [record_to_json(step), record_to_json(summary)]
    (tmp_path / "traj.jsonl").write_text("".join(lines))
    app = typer.Typer()
    app.command()(command)
    out = tmp_path / "out"
    args = [
        "--trajectories", str(tmp_path / "traj.jsonl"), "--model", str(model_dir),
        "--out", str(out), "--allow-suboptimal", "--layers", "all", "--sites",
        "pre_reasoning,post_reasoning", "--directions", "cf_to_base", "--moves", "goal",
        "--control-per-move", "0", "--max-new-tokens", "4", "--device", "cpu",
        "--n-resamples", "200",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    bundle = json.loads((out / "patch_results.json").read_text())
    assert bundle["config"]["reasoning"] == "recorded" and bundle["n_bases"] == 2
    # the counterfactuals' greedy completions of a random model hold no reasoning: dropped
    assert bundle["preparation"]["n_kept"] == 0
    assert any(k.startswith("counterfactual:") for k in bundle["preparation"]["dropped"])
    # a recorded prompt that another tokenizer/template produced is refused, naming the base
    text = (
        (tmp_path / "traj.jsonl")
        .read_text()
        .replace(
            json.dumps(prompt, separators=(",", ":")), json.dumps(bad_prompt, separators=(",", ":"))
        )
    )
    (tmp_path / "traj.jsonl").write_text(text)
    result = CliRunner().invoke(app, [*args, "--overwrite"])
    assert (
        result.exit_code != 0
        and "recorded prompt_token_ids do not end with the user message" in plain(result.output)
    )
