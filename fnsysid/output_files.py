"""Writing a run's folder: the resolved config, the CSV tables, ``summary.json`` and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf


def write_run(out: Path, cfg, tables: dict[str, pd.DataFrame], summary: dict,
              plot_title: str | None = None) -> None:
    """Write ``config.yaml``, ``<name>.csv`` for each table, ``summary.json`` and, with a
    ``plot_title``, ``error.png`` (drawn from the ``errors`` table)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if plot_title is not None:
        from .plotting import plot_run

        plot_run(tables["errors"], out / "error.png", title=plot_title)
