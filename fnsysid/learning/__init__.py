"""The algorithms: local solvers (GD, SGD), federated strategies (FedAvg and friends), the
local work of each client and the start model.

Imports only from :mod:`fnsysid.data`, :mod:`fnsysid.dynamics` and :mod:`fnsysid.config`.
"""
