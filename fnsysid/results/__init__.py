"""What a run produces: metrics, the history of a run's rounds and its divergence rule,
Theorem 1's bound, result tables and files, plots, and multirun folders read as data.

Imports only from :mod:`fnsysid.learning`, :mod:`fnsysid.data`, :mod:`fnsysid.dynamics` and
:mod:`fnsysid.config`.
"""
