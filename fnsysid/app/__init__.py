"""Entry points and the pipeline they run: the command line (``fnsysid``, ``fnsysid-plot``),
the Python API, the Flower apps of a deployment, and one experiment end to end.

Top of the import order: may import every other folder; nothing imports it.
"""
