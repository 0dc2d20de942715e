"""Figures from result folders, one module per client.

- :mod:`~fnsysid.results.plotting.run_plots`: one run's plots (``output.plot=true``).
- :mod:`~fnsysid.results.plotting.sweep_plots`: a multirun sweep's figures (``fnsysid-plot``).
- :mod:`~fnsysid.results.plotting.paper_panels`: the panels of the paper's figures
  (``scripts/make_figure.py``).
- :mod:`~fnsysid.results.plotting.style`: the look, legends, axes and saving they share.

This package imports none of them (nor matplotlib): a run with ``output.plot=false`` loads no
plotting code.
"""
