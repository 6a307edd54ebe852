"""Stage errors that stop a whole ``goalprobe demo`` run (issue 43).

A pre-flight refusal (:class:`~goalprobe.agents.preflight.PreflightRefused`: the model's token
budget cuts its steps) says the same of every generation stage, which would run on the same
model and budget: the scheduler (:mod:`goalprobe.scheduler`) stops at it, records the stages
left as not run and raises :class:`RunStopped`; ``goalprobe demo`` prints one ``error:`` line
and exits 2. In worker processes the other generation stages wait for the pre-flight's stage
(:func:`preflight_gate`), so none of them has started when it refuses.
"""

from __future__ import annotations

from goalprobe.config import DemoConfig

PREFLIGHT_STAGE = "rollouts"
"""The stage that runs the pre-flight."""


class RunStopped(RuntimeError):
    """A stage refused in a way that makes every stage left pointless (:func:`is_fatal`); the
    message is the refusal's, prefixed with the stage."""


def is_fatal(err: BaseException) -> bool:
    """Whether a stage's error stops the whole run: a pre-flight refusal."""
    from goalprobe.agents.preflight import PreflightRefused

    return isinstance(err, PreflightRefused)


def preflight_gate(config: DemoConfig, stages: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The stage ``name`` waits for besides its inputs: with a model that gets a pre-flight, every
    other generation stage starts after :data:`PREFLIGHT_STAGE` (a refusal stops them all)."""
    from goalprobe.agents.bundled import is_bundled
    from goalprobe.stages import SERVER_STAGES

    if name == PREFLIGHT_STAGE or name not in SERVER_STAGES or PREFLIGHT_STAGE not in stages:
        return ()
    if config.preflight.steps < 1 or is_bundled(config.agent.model):
        return ()
    return (PREFLIGHT_STAGE,)
