"""The decision stage's per-step lens file (goalprobe.probes.decision_steps, written by
goalprobe.stages.decision) on a real bundled-agent step: the chunks cut the step's reasoning
without losing a character, the lens at each chunk end is the one the stage computes, and the
file reads back what was written (and refuses what it is not)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from goalprobe.activations.capture import make_backend
from goalprobe.agents.harmony import HarmonyTokenIds, find_anchors
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.probes.decision_steps import (
    chunk_texts,
    read_decision_steps,
    step_record,
    write_decision_steps,
)
from goalprobe.probes.decision_time import lens_probs, step_positions
from readout_fixtures import model_probs

from goalprobe.stages.decision import _step_record


@pytest.fixture(scope="module")
def steps(tmp_path_factory, bundled_agent):
    model, tokenizer = bundled_agent
    grids = generate_grid_set(GridSetConfig(sizes=(7,), densities=(0.4,), n_per_cell=2, seed=9))
    out = tmp_path_factory.mktemp("lens-steps") / "trajectories.jsonl"
    config = RolloutConfig(episodes_per_grid=1, horizon_steps=2, max_new_tokens=256, seed=1)
    run_rollouts(grids, LocalBackend(model, tokenizer), config, out, progress=False)
    found = [s for e in read_trajectories(out) for s in e.steps if s.action is not None]
    assert len(found) >= 2, "the bundled agent answered fewer than two steps"
    return found[:3]


def _read(step, model, tokenizer, chunk: int):
    action = Action[step.action]
    pos = step_positions(tokenizer, step.prompt_token_ids, step.generated_token_ids, action, chunk)
    assert pos is not None
    ids = [*step.prompt_token_ids, *step.generated_token_ids]
    backend = make_backend("hooks", model, tokenizer)
    probs = lens_probs(backend, ids, [*pos.chunk_ends, pos.answer], pos.candidates)
    return action, pos, ids, probs


def test_a_step_record_cuts_the_reasoning_into_its_chunks(steps, bundled_agent, tmp_path):
    model, tokenizer = bundled_agent
    records = []
    for step in steps:
        action, pos, ids, probs = _read(step, model, tokenizer, chunk=5)
        record = _step_record(tokenizer, step, action, pos, ids, probs)
        records.append(record)
        # the reasoning: from the analysis message's first token to the post-reasoning anchor
        special = HarmonyTokenIds.from_tokenizer(tokenizer)
        anchors = find_anchors(ids, special)
        start = ids.index(special.message, anchors.pre_reasoning[2]) + 1
        reasoning = ids[start : anchors.post_reasoning[0]]
        assert record["reasoning_tokens"] == len(reasoning)
        text = "".join(c["text"] for c in record["chunks"])
        assert text == tokenizer.decode(reasoning)
        assert text.strip() == (step.reasoning or "").strip()
        assert [c["end"] for c in record["chunks"]] == list(pos.chunk_offsets)
        assert all(c["end"] % 5 == 4 for c in record["chunks"][:-1])
        # every chunk's lens after every block, and the answer's, as computed (4 decimals)
        got = np.asarray([c["probs"] for c in record["chunks"]]).transpose(1, 0, 2)
        assert np.allclose(got, probs[:, :-1], atol=5e-5)
        assert np.allclose(record["answer"], probs[:, -1], atol=5e-5)
    path = write_decision_steps(
        tmp_path / "decision" / "steps.jsonl",
        records,
        agent="bundled",
        chunk=5,
        layers=probs.shape[0],
    )
    lens = read_decision_steps(path)
    assert lens.chunk == 5 and lens.layers == probs.shape[0] and len(lens.steps) == len(steps)
    for step in steps:
        back = lens.steps[(step.grid_id, step.episode, step.step)]
        assert back.action == Action[step.action]
        _, pos, ids, probs = _read(step, model, tokenizer, chunk=5)
        # the decoded action at the last block is the model's own choice among the four tokens
        own = model_probs(model, ids, [*pos.chunk_ends, pos.answer], pos.candidates)
        assert [c.decoded().value for c in back.chunks] == own[:-1].argmax(-1).tolist()
        assert int(back.answer[-1].argmax()) == int(own[-1].argmax())


def test_chunk_texts_keep_every_character_of_a_split_character():
    # a byte-level decoder that shows a half character as U+FFFD: the chunk texts are the
    # growth of the decoded prefix, so they still concatenate to the whole
    data = "a→b".encode()

    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    texts = chunk_texts(decode, list(data), [1, 2, len(data) - 1])
    assert "".join(texts) == "a→b"


def test_the_reader_refuses_other_files(tmp_path):
    probs = np.full((2, 2, 4), 0.25)
    record = step_record(("g", 0, 1), Action.UP, 3, [2], [1.0], ["abc"], probs)
    path = write_decision_steps(tmp_path / "s.jsonl", [record], agent="a", chunk=3, layers=2)
    assert read_decision_steps(path).steps[("g", 0, 1)].chunks[0].text == "abc"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    for change, match in (
        ({"schema": "goalprobe.other"}, "not a goalprobe.decision_steps"),
        ({"schema_version": 2}, "schema_version 2"),
        ({"layers": 3}, "expected \\(3, 4\\)"),
        ({"actions": ["DOWN", "UP", "LEFT", "RIGHT"]}, "action order"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join([json.dumps({**header, **change}), *lines[1:]]) + "\n")
        with pytest.raises(ValueError, match=match):
            read_decision_steps(bad)
    with pytest.raises(ValueError, match="probs must be"):
        step_record(("g", 0, 1), Action.UP, 3, [2, 3], [0.5, 1.0], ["a", "b"], probs)
    assert not (tmp_path / "s.jsonl.part").exists()
