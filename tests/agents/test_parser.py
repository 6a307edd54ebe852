"""The action parser: accepted forms, rejected forms, and fuzzing (never raises, round-trips)."""

from __future__ import annotations

import json

import pytest
from goalprobe.agents.parser import ParseResult, parse_action
from goalprobe.gridworld.core import Action
from hypothesis import given, settings
from hypothesis import strategies as st

ACTIONS = st.sampled_from(list(Action))


def random_case(draw, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if f else c.lower() for c, f in zip(word, flips, strict=True))


@st.composite
def noisy_answers(draw) -> tuple[Action, str]:
    """A valid answer for a random action, wrapped in the noise the parser must tolerate."""
    action = draw(ACTIONS)
    value = random_case(draw, action.name)
    key = random_case(draw, "action")
    ws = st.sampled_from(["", " ", "\n", "  ", "\t", "\n\n"])
    body = f'{{{draw(ws)}"{key}"{draw(ws)}:{draw(ws)}"{draw(ws)}{value}{draw(ws)}"'
    body += draw(st.sampled_from(["", ",", ', "why": "shortest"', ', "n": [1, {"a": 2}]']))
    body += draw(ws) + "}"
    fence = draw(st.sampled_from([("", ""), ("```\n", "\n```"), ("```json\n", "\n```")]))
    # surrounding prose never contains braces or an action key
    prose = st.text(alphabet=st.characters(blacklist_characters="{}\"'"), max_size=40)
    text = draw(prose) + fence[0] + body + fence[1] + draw(prose)
    return action, text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_never_raises_on_arbitrary_text(text):
    result = parse_action(text)
    assert isinstance(result, ParseResult)
    assert (result.action is None) == (result.error is not None)
    assert result.ok == (result.action is not None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("{}[]\":,'aAcCtTiIoOnNuUpP \n`")), max_size=300))
def test_never_raises_on_json_like_noise(text):
    result = parse_action(text)
    assert (result.action is None) == (result.error is not None)


@settings(max_examples=200, deadline=None)
@given(
    ACTIONS,
    st.dictionaries(
        st.text(max_size=8).filter(lambda k: k.strip().lower() != "action"),
        st.integers() | st.text(max_size=8),
        max_size=3,
    ),
)
def test_round_trips_valid_json(action, extra):
    text = json.dumps({**extra, "action": action.name})
    result = parse_action(text)
    assert result.action is action
    assert result.form == "json"


@settings(max_examples=300, deadline=None)
@given(noisy_answers())
def test_tolerates_case_whitespace_fences_trailing_text(case):
    action, text = case
    result = parse_action(text)
    assert result.action is action, (text, result)


@settings(max_examples=100, deadline=None)
@given(ACTIONS, ACTIONS)
def test_conflicting_objects_are_rejected(first, second):
    text = f'{{"action": "{first.name}"}}\nor maybe\n{{"action": "{second.name}"}}'
    result = parse_action(text)
    if first is second:
        assert result.action is first
    else:
        assert result.action is None
        assert "conflicting" in result.error


def test_study_prompt_format_with_trailing_comma():
    # appendix G's own example object ends with a trailing comma
    result = parse_action('{\n"action": "RIGHT",\n}')
    assert result.action is Action.RIGHT
    assert result.form == "relaxed_json"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{'action': 'down'}", Action.DOWN),
        ('{action: "left"}', Action.LEFT),
        ('I will go {"ACTION": " Up "} now.', Action.UP),
        ('{"action": "UP", "reason": {"path": ["UP", "LEFT"]}}', Action.UP),
        ('{"action": "LEFT"', Action.LEFT),  # cut off by the token limit: key_value form
    ],
)
def test_accepted_forms(text, expected):
    assert parse_action(text).action is expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (None, "no final answer"),
        ("", "empty"),
        ("   \n", "empty"),
        ("UP", "no {"),
        ('{"move": "UP"}', "no {"),
        ('{"action": "NORTH"}', "unknown action"),
        ('{"action": ["UP"]}', "must be a string"),
        ('{"action": "UP", "action": "DOWN"}', "twice"),
        ('{"action": "UP", "Action": "DOWN"}', "conflicting"),
        ('{"action": "UP"} {"action": "LEFT"}', "conflicting"),
        ("[" * 5000, "no {"),
    ],
)
def test_rejected_forms_say_why(text, needle):
    result = parse_action(text)
    assert result.action is None
    assert needle in result.error
