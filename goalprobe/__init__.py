"""goalprobe: is an LLM agent goal-directed? Its behaviour in a text grid world, beside what
probes read from its residual stream.

The objects a notebook needs are importable from the package itself (``import goalprobe as
gp; gp.generate_grid_set(...)``), each imported on first use (PEP 562), so ``import
goalprobe`` loads neither torch nor any room; ``goalprobe.__all__`` lists them. The worked
examples in ``examples/`` use nothing else.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    # grid sets: generation, the JSONL format, false-belief pairs
    "goalprobe.gridworld.core": ("Action", "CellType", "Grid", "State"),
    "goalprobe.gridworld.generator": ("GridSetConfig", "generate_grid_set"),
    "goalprobe.gridworld.io": ("read_grid_set", "write_grid_set"),
    "goalprobe.gridworld.false_belief": ("FalseBeliefSetConfig", "generate_false_belief_set"),
    "goalprobe.gridworld.optimal": ("solve",),
    "goalprobe.gridworld.fog": ("fog_episode", "free_space_episode", "generate_fog_set"),
    # the bundled agents and any local model
    "goalprobe.agents.bundled": ("BUNDLED_AGENTS", "bundled_agent_dir", "load_bundled_agent"),
    "goalprobe.agents.models": ("load_model",),
    "goalprobe.agents.agent_config": ("Agent", "AgentConfig"),
    # rollouts and prompt-only states
    "goalprobe.agents.local_backend": ("LocalBackend",),
    "goalprobe.agents.rollout": ("RolloutConfig", "run_rollouts"),
    "goalprobe.agents.trajectories": ("read_trajectories",),
    "goalprobe.agents.prompt_states": ("PromptStatesConfig", "write_prompt_states"),
    "goalprobe.agents.harmony": ("encode_prompt",),
    # the activation store
    "goalprobe.activations.capture": ("make_backend",),
    "goalprobe.activations.extract": ("ExtractConfig", "default_layers", "extract"),
    "goalprobe.activations.store": ("ActivationStore",),
    # probes: cell types, positions, distances, plans, and their files
    "goalprobe.probes.cell_probes": (
        "CoordinateCellProbe",
        "MajorityCellBaseline",
        "PerCellProbe",
    ),
    "goalprobe.probes.baselines": ("CellPrior",),
    "goalprobe.probes.position": ("PositionProbe", "PositionPrior", "position_scores"),
    "goalprobe.probes.distance": ("GoalDistanceRegressor",),
    "goalprobe.probes.plan_decoder": ("PlanDecoder",),
    "goalprobe.probes.probe_sweep": ("ProbeSweepConfig", "StoreProbeLoader", "run_probe_sweep"),
    "goalprobe.probes.splits": ("split_by_grid",),
    "goalprobe.probes.decision_time": ("lens_probs", "step_positions"),
    "goalprobe.probes.serialization": (
        "load_plan_decoder",
        "load_probe",
        "save_plan_decoder",
        "save_probe",
    ),
    "goalprobe.probes.decoded_maps": ("read_decoded_maps", "write_decoded_maps"),
    # decoding prompt-only states with the headline cell probe
    "goalprobe.stages.decode": ("decode_prompt_states", "headline_probe"),
    # scoring: policy against decoded belief, and MEG
    "goalprobe.probes.scoring.config": ("ScoreConfig",),
    "goalprobe.stages.scoring": ("score_run",),
    "goalprobe.probes.scoring.meg": ("known_utility_meg", "unknown_utility_meg"),
    "goalprobe.probes.scoring.meg_table": ("empirical_policy", "grid_meg"),
    # the whole study, and the run directory it writes
    "goalprobe.config": ("DemoConfig", "demo_config"),
    "goalprobe.demo": ("run_demo",),
    "goalprobe.run_layout": ("RunLayout",),
    "goalprobe.version": ("package_version",),
}

_MODULE_OF: dict[str, str] = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_MODULE_OF, "__version__"])


def __getattr__(name: str) -> Any:
    """Import an exported name on first use (PEP 562) and keep it in the module's namespace."""
    if name == "__version__":
        from goalprobe.version import package_version

        value: Any = package_version()
    elif name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    else:
        raise AttributeError(f"module 'goalprobe' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's own attributes and every lazily exported name."""
    return sorted({*globals(), *__all__})
