"""fnsysid: federated identification of linearly-parameterized nonlinear systems.

Python API: :func:`run` (one experiment, as the command line runs it) and
:func:`load_trajectories` (read and check trajectory files).
"""

import os

# Every array operation here is small or memory-bound: BLAS threads only compete with the
# other jobs of a sweep for the cores (and spin on a busy machine). One thread per process,
# unless the environment says otherwise; effective when numpy is imported after fnsysid.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
__all__ = ["run", "load_trajectories", "ConfigError"]


def __getattr__(name):          # imported on first use: `import fnsysid` stays light
    if name in ("run", "load_trajectories"):
        from fnsysid.app import api

        return getattr(api, name)
    if name == "ConfigError":
        from fnsysid.config.checks import ConfigError

        return ConfigError
    raise AttributeError(f"module 'fnsysid' has no attribute {name!r}")
