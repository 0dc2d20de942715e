"""Config group options: which YAML files each group (system, strategy, ...) offers.

The one place that knows where group options live; the command line, the builders and the
plotting read group options through :func:`options` and :func:`load_option`.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

#: the project's config folder (``conf/`` beside the package)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def options(group: str) -> list[str]:
    """Options of a config group: the YAML files in ``conf/<group>/``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def load_option(group: str, name: str) -> DictConfig:
    """The YAML of option ``name`` of ``group``, unresolved."""
    return OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
