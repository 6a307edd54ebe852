"""Fogged grids' prompts (goalprobe.agents.prompts, variant ``fog``): the packaged templates,
the worked example drawn in the fogged format, history and radius filled in, and templates
that cannot prompt fog say so."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.agents.prompts import (
    NO_HISTORY,
    PromptTemplate,
    build_instructions,
    build_messages,
)
from goalprobe.gridworld.core import Action, Grid, Variant
from goalprobe.gridworld.fog import history_text, render_fogged


def _example() -> Grid:
    walls = np.ones((5, 5), dtype=bool)
    walls[1:4, 1:4] = False
    return Grid(walls=walls, goal=(1, 3), start=(2, 1))


def test_the_worked_example_is_the_fogged_rendering():
    grid = _example()
    revealed = {(r, c) for r in range(4) for c in range(5)}  # all but the bottom row
    text = render_fogged(grid, grid.initial_state, revealed)
    assert text in build_instructions(variant=Variant.FOG, fog_radius=3)


def test_fog_messages_carry_radius_history_and_grid():
    grid = _example()
    text = render_fogged(grid, grid.initial_state, {(2, 1)})
    first = build_messages(text, variant=Variant.FOG, has_key=False, fog_radius=2)
    assert "within 2 rows and 2 columns" in first[0].content
    assert "{{" not in first[0].content and "{{" not in first[1].content
    assert NO_HISTORY in first[1].content and text in first[1].content
    history = history_text([((2, 1), Action.RIGHT), ((2, 2), Action.UP)])
    later = build_messages(text, variant=Variant.FOG, has_key=False, fog_radius=2, history=history)
    assert "(2, 1) RIGHT\n(2, 2) UP" in later[1].content
    assert later[1].content.index("(2, 2) UP") < later[1].content.index(text)


def test_fog_needs_a_radius_and_templates_that_have_it(tmp_path):
    with pytest.raises(ValueError, match="fog_radius"):
        build_instructions(variant=Variant.FOG)
    default = PromptTemplate.default()
    for name, value in (
        ("instructions_plain.txt", default.instructions_plain),
        ("instructions_key.txt", default.instructions_key),
        ("user_plain.txt", default.user_plain),
        ("user_key.txt", default.user_key),
        ("key_status_carrying.txt", default.key_status_carrying),
        ("key_status_not_carrying.txt", default.key_status_not_carrying),
    ):
        (tmp_path / name).write_text(value, encoding="utf-8")
    bare = PromptTemplate.from_dir(tmp_path)
    with pytest.raises(ValueError, match="cannot prompt fogged grids"):
        build_messages("x", variant=Variant.FOG, has_key=False, template=bare, fog_radius=3)
    (tmp_path / "instructions_fog.txt").write_text("Fog.", encoding="utf-8")
    with pytest.raises(ValueError, match="both or neither"):
        PromptTemplate.from_dir(tmp_path)
    (tmp_path / "user_fog.txt").write_text("{{grid}} without the past", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\{\{history\}\} exactly once"):
        PromptTemplate.from_dir(tmp_path)
