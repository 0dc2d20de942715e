"""The clients' data: simulated from a system or read from trajectory files, the held-out
trajectories, and the sufficient statistics the learning works on.

Imports only from :mod:`fnsysid.dynamics` and :mod:`fnsysid.config`.
"""
