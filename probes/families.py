"""Probe families: the estimators ``goalprobe train-probe`` and the ``probes`` stage fit, by name.

A family is a class implementing :data:`FAMILY_METHODS` (scikit-learn's estimator API plus what
:func:`~goalprobe.probes.serialization.save_probe` / ``load_probe`` need), registered with the
store labels it learns (:data:`TARGETS`)::

    from goalprobe.probes.families import register_probe_family

    @register_probe_family("ridge_cells", target="cell_type")
    class RidgeCellProbe(ClassifierMixin, BaseEstimator):
        ...

Then ``goalprobe train-probe STORE --probe ridge_cells`` (or ``--set probes.types=...`` in the
demo) fits it through :func:`make_probe`. Packages can also register through the entry-point
group ``goalprobe.probe_families`` (a module, imported on first use, or a class with a
``probe_target``). Built in: ``coordinate`` and ``per_cell`` (cell types), ``distance``,
``position`` (fitted by :func:`goalprobe.probes.position.position_scores`) and ``majority``. A
family's ``family`` hyperparameter is its read-out (``linear`` or ``mlp``), not this name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Target = Literal["cell_type", "distance", "position"]
TARGETS: dict[str, str] = {
    "cell_type": "cell types (N, S, S) uint8: ProbeData.cell_types; predict_proba -> "
    "(N, S, S, C) over classes_",
    "distance": "shortest-path distance to the goal (N,): ProbeData.goal_distance; predict -> (N,)",
    "position": "a flat cell index (N,) of the agent or the goal (position_scores)",
    "walls": "wall maps (N, S, S) uint8 cell types read per cell or per offset from the agent "
    "(wall_test.ConditionalWallProbe): predict_proba -> (N, P) wall probability",
}
"""The labels of the activation store a family can learn, and what it predicts for them."""

ENTRY_POINT_GROUP = "goalprobe.probe_families"
"""Entry-point group of probe families shipped by other packages."""


FAMILY_METHODS = ("fit", "predict", "score", "get_params", "_fitted_state", "_restore")
"""What a probe family implements: scikit-learn's estimator API (``fit(X, y, groups=None)`` on
activations ``X (N, F)`` and the target's labels, ``groups`` the grid ids for grouped early
stopping; ``get_params`` from :class:`sklearn.base.BaseEstimator`, JSON-ready, and ``clone``
must rebuild it from them), and its fitted state: ``_fitted_state() -> (tensors, fitted)``,
arrays for safetensors and JSON-ready scalars for the card (classifiers include ``classes_``),
which ``_restore(tensors, fitted)`` sets on a fresh instance."""


@dataclass(frozen=True)
class RegisteredFamily:
    """One registered probe family."""

    name: str
    """Its registry name (``--probe``, ``probes.types``)."""
    cls: type
    """The estimator class."""
    target: str
    """The labels it learns (a key of :data:`TARGETS`)."""

    def make(self, **params: Any) -> Any:
        """An unfitted instance with those of ``params`` the class takes (the verb's and the
        stage's shared options; a family without e.g. ``hidden_size`` ignores it)."""
        names = set(self.cls._get_param_names()) if hasattr(self.cls, "_get_param_names") else None
        kept = params if names is None else {k: v for k, v in params.items() if k in names}
        return self.cls(**kept)


def store_params(estimator: object, params: dict) -> None:
    """Set ``__init__``'s arguments (its ``locals()``) as attributes of the same names, unchanged
    (scikit-learn's estimator API)."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


_FAMILIES: dict[str, RegisteredFamily] = {}
_LOADED: list[bool] = []


def register_probe_family(
    name: str, cls: type | None = None, *, target: str = "cell_type"
) -> Callable[[type], type] | type:
    """Register ``cls`` as the probe family ``name`` learning ``target`` (also a decorator);
    ValueError on an unknown target, a class lacking :data:`FAMILY_METHODS`, or a taken name."""
    if target not in TARGETS:
        raise ValueError(f"probe family {name!r}: target {target!r} is not one of {list(TARGETS)}")

    def register(klass: type) -> type:
        missing = [m for m in FAMILY_METHODS if not callable(getattr(klass, m, None))]
        if missing:
            raise ValueError(f"probe family {name!r}: {klass.__name__} lacks {missing}")
        known = _FAMILIES.get(name)
        if known is not None and known.cls is not klass:
            raise ValueError(f"probe family {name!r} is already {known.cls.__qualname__}")
        _FAMILIES[name] = RegisteredFamily(name, klass, target)
        return klass

    return register if cls is None else register(cls)


def unregister_probe_family(name: str) -> None:
    """Remove the family ``name`` (a test's toy family, after the test)."""
    _FAMILIES.pop(name, None)


def _load() -> None:
    """Register the built-in families and those of installed entry points (once)."""
    if _LOADED:
        return
    _LOADED.append(True)
    from goalprobe.probes.cell_probes import (
        CoordinateCellProbe,
        MajorityCellBaseline,
        PerCellProbe,
    )
    from goalprobe.probes.distance import GoalDistanceRegressor
    from goalprobe.probes.position import PositionProbe
    from goalprobe.probes.wall_test import ConditionalWallProbe

    register_probe_family("coordinate", CoordinateCellProbe, target="cell_type")
    register_probe_family("per_cell", PerCellProbe, target="cell_type")
    register_probe_family("majority", MajorityCellBaseline, target="cell_type")
    register_probe_family("distance", GoalDistanceRegressor, target="distance")
    register_probe_family("position", PositionProbe, target="position")
    register_probe_family("conditional_wall", ConditionalWallProbe, target="walls")
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()
        if isinstance(loaded, type):
            register_probe_family(
                point.name, loaded, target=getattr(loaded, "probe_target", "cell_type")
            )


def probe_families() -> dict[str, RegisteredFamily]:
    """Every registered family by name."""
    _load()
    return dict(_FAMILIES)


def probe_family(name: str) -> RegisteredFamily:
    """The family registered as ``name`` (ValueError listing them when there is none)."""
    families = probe_families()
    if name not in families:
        raise ValueError(f"unknown probe family {name!r}; registered: {sorted(families)}")
    return families[name]


def make_probe(name: str, **params: Any) -> Any:
    """An unfitted estimator of the family ``name`` (:meth:`RegisteredFamily.make`)."""
    return probe_family(name).make(**params)


def family_name(estimator: Any) -> str | None:
    """The registry name of ``estimator``'s class (None: not registered)."""
    for entry in probe_families().values():
        if type(estimator) is entry.cls:
            return entry.name
    return None


def probe_classes() -> dict[str, type]:
    """Class name -> class of every registered family (what a card's ``class`` names)."""
    return {entry.cls.__name__: entry.cls for entry in probe_families().values()}
