"""Prompt templates of the grid-world task (study, appendix G.2 and G.3, in goalprobe's words).

Every step is one fresh conversation: a developer message with the instructions (legend,
objective, the ``(row, col)`` convention with a worked example, the JSON answer ``{"action":
"UP"}``, and for key variants the key and door rules) and a user message with the grid.

A template directory holds UTF-8 files (one trailing newline dropped)::

    instructions_plain.txt      developer message of variants without key and door
    instructions_key.txt        developer message of variants with a key or a door
    user_plain.txt              user message; must contain {{grid}}
    user_key.txt                user message; must contain {{grid}} and {{key_status}}
    key_status_carrying.txt     {{key_status}} when the agent carries the key
    key_status_not_carrying.txt ... and when it does not
    instructions_harm.txt       optional: harm grids (flower beds ``F``); a line {{moral}}
    moral_harm.txt              optional: that line under moral conditioning (else dropped)
    instructions_fog.txt        optional: fogged grids (``*`` hidden); may contain {{radius}}
    user_fog.txt                optional: must contain {{grid}} and {{history}}

The worked examples use the grid format of :mod:`goalprobe.gridworld.text` (a test checks it).
The bundled agent was trained on the default templates (``agents/templates``).

**Prompt coverage**: how much of a prompt the agent's tokenizer can read. A word-level tokenizer
(the bundled agents') maps every piece outside its vocabulary to one unknown token (``[UNK]``): a
grid symbol it lacks (the harm grids' flower bed ``F``) is then the same input as any other unknown
symbol, and an instruction made of unknown words (the moral conditioning) is noise. A study run on
such prompts measures nothing, so every generation path records the share of unknown tokens in the
grid and in the instructions (:func:`prompt_coverage`, in the trajectory header's
``prompt_coverage``), and the verdicts read :func:`not_readable` to print ``"n/a: the agent cannot
read ..."`` instead of a verdict. A byte-level tokenizer (GPT-OSS's o200k) has no unknown token and
reads everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from goalprobe.agents.backend import ChatFormatBackend
from goalprobe.agents.harmony import Message, ReasoningEffort, render_prompt
from goalprobe.gridworld.core import Grid, State, Variant
from goalprobe.gridworld.text import render

TEMPLATE_FILES: dict[str, str] = {
    "instructions_plain": "instructions_plain.txt",
    "instructions_key": "instructions_key.txt",
    "user_plain": "user_plain.txt",
    "user_key": "user_key.txt",
    "key_status_carrying": "key_status_carrying.txt",
    "key_status_not_carrying": "key_status_not_carrying.txt",
}
"""Field of :class:`PromptTemplate` -> file name in a template directory."""

OPTIONAL_TEMPLATE_FILES: dict[str, str] = {
    "instructions_harm": "instructions_harm.txt",
    "moral_harm": "moral_harm.txt",
    "instructions_fog": "instructions_fog.txt",
    "user_fog": "user_fog.txt",
}
"""Optional fields (harm grids, fogged grids) -> file name; a directory without them reads as
None."""

GRID_FIELD = "{{grid}}"
MORAL_FIELD = "{{moral}}"
KEY_STATUS_FIELD = "{{key_status}}"
HISTORY_FIELD = "{{history}}"
RADIUS_FIELD = "{{radius}}"
NO_HISTORY = "none yet"
"""What {{history}} becomes at an episode's first step."""

KEY_VARIANTS: frozenset[str] = frozenset(
    {
        Variant.KEY_DOOR,
        Variant.KEY_NO_DOOR,
        Variant.KEY_DOOR_CONTROL,
        Variant.TWO_PATH_KEY,
        Variant.TWO_PATH_NO_KEY,
    }
)
"""Variants prompted with the key-and-door instructions (study, section 4.3: appendix G.3 for all
three environments). The matched no-key controls get the same prompt as their key variant, so
a variant and its control differ only in the grid. ``plain`` gets the plain instructions."""


@dataclass(frozen=True)
class PromptTemplate:
    """The texts a prompt is built from: one field per template file (:data:`TEMPLATE_FILES`,
    :data:`OPTIONAL_TEMPLATE_FILES`; the module docstring says what each holds), the optional
    ones None when the templates cannot prompt harm or fogged grids; ``source``: where the
    texts were read from (for error messages and records)."""

    instructions_plain: str
    instructions_key: str
    user_plain: str
    user_key: str
    key_status_carrying: str
    key_status_not_carrying: str
    source: str = "<memory>"
    instructions_harm: str | None = None
    moral_harm: str | None = None
    instructions_fog: str | None = None
    user_fog: str | None = None

    def __post_init__(self) -> None:
        files = {**TEMPLATE_FILES, **OPTIONAL_TEMPLATE_FILES}
        for first, second in (
            ("instructions_fog", "user_fog"),
            ("instructions_harm", "moral_harm"),
        ):
            if (getattr(self, first) is None) != (getattr(self, second) is None):
                raise ValueError(
                    f"prompt template {self.source}: give both or neither of {files[first]} "
                    f"and {files[second]}"
                )
        if self.instructions_harm is not None and (
            self.instructions_harm.split("\n").count(MORAL_FIELD) != 1
            or self.instructions_harm.count(MORAL_FIELD) != 1
            or "\n" in (self.moral_harm or "")
        ):
            raise ValueError(
                f"prompt template {self.source}: {OPTIONAL_TEMPLATE_FILES['instructions_harm']} "
                f"must contain {MORAL_FIELD} exactly once, on a line of its own, and "
                f"{OPTIONAL_TEMPLATE_FILES['moral_harm']} must be one line"
            )
        for name, fields in (
            ("user_fog", (GRID_FIELD, HISTORY_FIELD)),
            ("user_plain", (GRID_FIELD,)),
            ("user_key", (GRID_FIELD, KEY_STATUS_FIELD)),
        ):
            text = getattr(self, name)
            for placeholder in fields:
                if text is not None and text.count(placeholder) != 1:
                    raise ValueError(
                        f"prompt template {self.source}: {files[name]} must contain "
                        f"{placeholder} exactly once"
                    )

    @classmethod
    def from_dir(cls, path: str | Path) -> PromptTemplate:
        """Read a template directory (the six files named in :data:`TEMPLATE_FILES`)."""
        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"prompt template directory {directory} does not exist")
        texts = {}
        for name, filename in {**TEMPLATE_FILES, **OPTIONAL_TEMPLATE_FILES}.items():
            file = directory / filename
            if file.is_file():
                texts[name] = file.read_text(encoding="utf-8").removesuffix("\n")
            elif name in TEMPLATE_FILES:
                raise FileNotFoundError(f"prompt template {directory} lacks {filename}")
        return cls(**texts, source=str(directory))

    @classmethod
    def default(cls) -> PromptTemplate:
        """The packaged templates (``agents/templates``), which the bundled agent knows."""
        root = resources.files("goalprobe.agents").joinpath("templates")
        texts = {
            name: root.joinpath(filename).read_text(encoding="utf-8").removesuffix("\n")
            for name, filename in {**TEMPLATE_FILES, **OPTIONAL_TEMPLATE_FILES}.items()
        }
        return cls(**texts, source="agents/templates")


def uses_key_prompt(variant: str) -> bool:
    """Whether ``variant`` is prompted with the key-and-door instructions."""
    return variant in KEY_VARIANTS


@lru_cache(maxsize=1)
def _default_template() -> PromptTemplate:
    return PromptTemplate.default()


def _optional(template: PromptTemplate, names: tuple[str, str], grids: str) -> tuple[str, str]:
    """The two optional texts ``names`` that prompt ``grids`` (e.g. harm grids)."""
    first, second = getattr(template, names[0]), getattr(template, names[1])
    if first is None or second is None:
        raise ValueError(
            f"prompt template {template.source} has no "
            f"{OPTIONAL_TEMPLATE_FILES[names[0]]}; it cannot prompt {grids}"
        )
    return first, second


def build_instructions(
    *,
    variant: str,
    template: PromptTemplate | None = None,
    moral_conditioning: bool = False,
    fog_radius: int | None = None,
) -> str:
    """The developer message (instructions) for ``variant``.

    ``moral_conditioning`` adds the instruction to avoid the flower beds to the instructions of
    harm grids (variant ``harm``); other variants ignore it. ``fog_radius`` fills ``{{radius}}``
    in the instructions of fogged grids (variant ``fog``).
    """
    template = _default_template() if template is None else template
    if variant == Variant.FOG:
        instructions, _ = _optional(template, ("instructions_fog", "user_fog"), "fogged grids")
        if RADIUS_FIELD in instructions and fog_radius is None:
            raise ValueError("fogged grids need fog_radius to fill {{radius}}")
        return instructions.replace(RADIUS_FIELD, str(fog_radius))
    if variant == Variant.HARM:
        harm, moral_line = _optional(template, ("instructions_harm", "moral_harm"), "harm grids")
        moral = [moral_line] if moral_conditioning else []
        lines = harm.split("\n")
        at = lines.index(MORAL_FIELD)
        return "\n".join([*lines[:at], *moral, *lines[at + 1 :]])
    return template.instructions_key if uses_key_prompt(variant) else template.instructions_plain


def build_messages(
    grid_text: str,
    *,
    variant: str,
    has_key: bool,
    template: PromptTemplate | None = None,
    moral_conditioning: bool = False,
    history: str | None = None,
    fog_radius: int | None = None,
) -> list[Message]:
    """The conversation of one step: ``[Message("developer", instructions), Message("user",
    grid)]`` (:func:`build_instructions`; ``grid_text`` as
    :func:`goalprobe.gridworld.text.render` writes it; key variants add the key status line
    from ``has_key``; ``template`` None uses :meth:`PromptTemplate.default`). Fogged grids
    only: ``history`` is the past ``(state, action)`` pairs
    (:func:`goalprobe.gridworld.fog.history_text`), None or empty at the first step.
    """
    template = _default_template() if template is None else template
    if variant == Variant.FOG:
        _, user_fog = _optional(template, ("instructions_fog", "user_fog"), "fogged grids")
        user = user_fog.replace(HISTORY_FIELD, history or NO_HISTORY).replace(GRID_FIELD, grid_text)
    elif uses_key_prompt(variant):
        status = template.key_status_carrying if has_key else template.key_status_not_carrying
        user = template.user_key.replace(GRID_FIELD, grid_text).replace(KEY_STATUS_FIELD, status)
    else:
        user = template.user_plain.replace(GRID_FIELD, grid_text)
    instructions = build_instructions(
        variant=variant,
        template=template,
        moral_conditioning=moral_conditioning,
        fog_radius=fog_radius,
    )
    return [Message("developer", instructions), Message("user", user)]


def state_messages(
    grid: Grid,
    state: State,
    *,
    template: PromptTemplate | None = None,
    moral_conditioning: bool = False,
) -> list[Message]:
    """:func:`build_messages` of ``grid`` (its shown grid) at ``state``, as a rollout step of an
    unfogged grid shows it."""
    return build_messages(
        render(grid.prompt_grid, state),
        variant=grid.variant,
        has_key=state.has_key,
        template=template,
        moral_conditioning=moral_conditioning,
    )


MAX_PIECES = 12
"""Distinct unknown pieces listed per part (the count is always complete)."""


def _count(tokenizer: Any, texts: Iterable[str], unk: int | None) -> dict:
    """Tokens, unknown tokens, their share and the distinct unknown pieces over ``texts``."""
    tokens = unknown = 0
    pieces: list[str] = []
    for text in texts:
        if not text:
            continue
        if unk is None:  # nothing can be unknown: count the tokens only
            tokens += len(tokenizer.encode(text, add_special_tokens=False))
            continue
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        tokens += len(ids)
        for token_id, (start, end) in zip(ids, encoded["offset_mapping"], strict=True):
            if token_id == unk:
                unknown += 1
                piece = text[start:end].strip() or text[start:end]
                if piece not in pieces:
                    pieces.append(piece)
    return _part(tokens, unknown, pieces)


def _part(tokens: int, unknown: int, pieces: Iterable[str]) -> dict:
    """One part's record: its counts, the unknown share and the first distinct pieces."""
    share = unknown / tokens if tokens else 0.0
    return dict(tokens=tokens, unknown=unknown, share=share, pieces=sorted(pieces)[:MAX_PIECES])


def prompt_coverage(tokenizer: Any, prompts: Iterable[tuple[str, str]]) -> dict | None:
    """The share of unknown tokens in the grids and in the instructions of ``prompts``.

    ``tokenizer``: a Hugging Face tokenizer (a fast one when it has an unknown token: offsets
    name the unknown pieces), or None (nothing can be said: None is returned). ``prompts``:
    ``(grid_text, prompt_text)`` each, the instructions being the prompt without its grid text;
    each distinct grid and instruction text is counted once.

    Returns:
        ``{"unk_token_id", "grid": PART, "instructions": PART, "readable", "unreadable"}`` with
        PART ``{tokens, unknown, share, pieces}``; ``readable`` is False where any token of
        either part is unknown, and ``unreadable`` then says what (:func:`not_readable`).
    """
    if tokenizer is None:
        return None
    grids: dict[str, None] = {}
    instructions: dict[str, None] = {}
    for grid_text, prompt_text in prompts:
        grids[grid_text] = None
        instructions[prompt_text.replace(grid_text, "\n", 1) if grid_text else prompt_text] = None
    unk = getattr(tokenizer, "unk_token_id", None)  # None: byte-level BPE, nothing unknown
    unk = None if unk is None else int(unk)
    out: dict[str, Any] = {
        "unk_token_id": unk,
        "grid": _count(tokenizer, grids, unk),
        "instructions": _count(tokenizer, instructions, unk),
    }
    out["readable"] = out["grid"]["unknown"] == 0 and out["instructions"]["unknown"] == 0
    out["unreadable"] = not_readable(out)
    return out


def not_readable(coverage: dict | None) -> str | None:
    """``"n/a: the agent cannot read X"`` for a coverage record with unknown tokens, else None
    (also None for no record: a backend without a tokenizer to ask)."""
    if not coverage:
        return None
    parts = []
    grid, text = coverage["grid"], coverage["instructions"]
    if grid["unknown"]:
        parts.append(
            f"the grid symbol(s) {' '.join(grid['pieces'])} "
            f"({grid['unknown']} of {grid['tokens']} grid tokens unknown)"
        )
    if text["unknown"]:
        parts.append(
            f"{text['unknown']} of {text['tokens']} instruction tokens "
            f"({', '.join(repr(p) for p in text['pieces'])})"
        )
    if not parts:
        return None
    return "n/a: the agent cannot read " + " and ".join(parts)


def merge_coverage(records: Iterable[dict | None]) -> dict | None:
    """One coverage record over several (e.g. a study's conditions): counts summed, pieces
    united; None when every record is None."""
    present = [r for r in records if r]
    if not present:
        return None
    out: dict[str, Any] = {"unk_token_id": present[0]["unk_token_id"]}
    for part in ("grid", "instructions"):
        out[part] = _part(
            sum(r[part]["tokens"] for r in present),
            sum(r[part]["unknown"] for r in present),
            {p for r in present for p in r[part]["pieces"]},
        )
    out["readable"] = all(r["readable"] for r in present)
    out["unreadable"] = not_readable(out)
    return out


def backend_coverage(
    backend: object,
    conversations: Iterable[tuple[str, Sequence[Message]]],
    reasoning_effort: ReasoningEffort,
) -> dict | None:
    """:func:`prompt_coverage` of ``(grid_text, messages)`` conversations as ``backend`` renders
    them (in its own chat format where it renders one, else the harmony rendering) under its
    ``tokenizer``; None for a backend without a tokenizer."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return None
    render = (
        backend.chat_format.render_prompt
        if isinstance(backend, ChatFormatBackend)
        else render_prompt
    )
    prompts = [(grid, render(list(messages), reasoning_effort)) for grid, messages in conversations]
    return prompt_coverage(tokenizer, prompts)
