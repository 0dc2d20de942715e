"""The clients' data of a run, as one :class:`~fnsysid.model.ClientData` whatever its source.

``data`` config group: trajectories simulated from the chosen system
(:func:`fnsysid.model.generate`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from .model import ClientData, Model, generate
from .validate import plain


def load_data(cfg: DictConfig, model: Model, optimizer) -> ClientData:
    """The clients' sufficient statistics (and samples, if the optimizer needs them)."""
    return generate(model, cfg.M, plain(cfg.N), cfg.T, cfg.eps, cfg.repeats, cfg.seed,
                    keep_samples=optimizer.needs_samples,
                    shared_noise=bool(cfg.data.shared_noise))
