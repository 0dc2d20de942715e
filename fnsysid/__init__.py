"""fnsysid: federated identification of linearly-parameterized nonlinear systems.

Python API (the command line's runs as function calls):

- :func:`run`: one experiment, checked as the command line checks it; returns a
  :class:`Result` with the run's tables (DataFrames) and summary.
- :func:`load_trajectories`: read and check trajectory files (the ``data=files`` layout).
- :class:`FederatedSysID`: an estimator for notebooks (fit a fleet held in DataFrames, then
  predict, simulate, score and print the identified equations) over the same engine.
- :class:`ConfigError`: a setting that is not allowed (one-line message);
  :class:`DataError`: trajectory or truth files that cannot be used.

Importing the package loads nothing heavy and changes no global state: the names above are
imported on first use.
"""

__version__ = "0.1.0"
__all__ = ["run", "load_trajectories", "Result", "ConfigError", "DataError",
           "FederatedSysID", "__version__"]

#: where each public name lives
_PUBLIC = {
    "run": "fnsysid.app.api",
    "load_trajectories": "fnsysid.app.api",
    "Result": "fnsysid.app.experiment",
    "ConfigError": "fnsysid.config.errors",
    "DataError": "fnsysid.config.errors",
    "FederatedSysID": "fnsysid.app.estimator",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'fnsysid' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | {"__doc__", "__name__", "__version__"})
