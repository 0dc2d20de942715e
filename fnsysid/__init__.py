"""fnsysid: federated identification of linearly-parameterized nonlinear systems."""

__version__ = "0.1.0"
