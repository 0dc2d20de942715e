"""The classes a config group names by ``_target_``, each with the pydantic model of its keys.

A system, feature map, local solver or strategy registers itself where it is defined: its
group's base class (:class:`~fnsysid.dynamics.systems.System`,
:class:`~fnsysid.dynamics.features.Library`, :class:`~fnsysid.learning.optim.LocalSolver`,
:class:`~fnsysid.learning.strategies.Strategy`) derives from :class:`Registered`, and a subclass
that sets ``settings`` in its own body is entered under its class path. ``settings`` is a
pydantic model deriving from the group's base model in :mod:`fnsysid.config.schema`, or the
name of a model there (``settings = "Federated"``: what the built-in classes give, so that
their modules import no pydantic)::

    class PooledLS(Strategy):
        class settings(schema.Strategy):
            model_config = ConfigDict(extra="forbid")
            ridge: schema.NonNegReal = 0.0

The schema's tables (``schema.SYSTEMS``, ``FEATURE_MAPS``, ``OPTIMIZERS``, ``STRATEGIES``)
are read from here; a class that sets no ``settings`` is in no table, and its keys are checked
by its constructor only. This module imports nothing of the project, so that every module may
import it.
"""

from __future__ import annotations

from typing import Any, ClassVar

#: the config groups whose options name a class by ``_target_``
GROUPS = ("system", "feature_map", "optimizer", "strategy")

_TABLES: dict[str, dict[str, tuple[type, Any]]] = {group: {} for group in GROUPS}
_VERSION = [0]


def target(cls: type) -> str:
    """The ``_target_`` that names ``cls``: its module and qualified name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register(group: str, cls: type, settings: type) -> None:
    """Enter ``cls`` with the model of its keys ``settings`` under ``group``."""
    if group not in _TABLES:
        raise ValueError(f"group {group!r}; allowed: {', '.join(GROUPS)}")
    _TABLES[group][target(cls)] = (cls, settings)
    _VERSION[0] += 1


def table(group: str) -> dict[str, Any]:
    """``_target_`` -> settings model (or its name in :mod:`fnsysid.config.schema`) of the
    classes registered under ``group``, in the order they were defined."""
    return {t: settings for t, (_, settings) in _TABLES[group].items()}


def classes(group: str) -> dict[str, type]:
    """``_target_`` -> class of the classes registered under ``group``."""
    return {t: cls for t, (cls, _) in _TABLES[group].items()}


def version() -> int:
    """A number that changes whenever a class is registered (the schema rebuilds on it)."""
    return _VERSION[0]


class Registered:
    """Base of the classes a group names: a subclass that sets ``settings`` in its own body is
    registered under the base's ``config_group``."""

    #: the config group of this family (set by the family's base class)
    config_group: ClassVar[str] = ""
    #: the pydantic model of the class's keys, or its name in fnsysid.config.schema (None: not
    #: registered)
    settings: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("settings") is not None:
            register(cls.config_group, cls, cls.__dict__["settings"])
