"""The systems and the model class: dynamics, feature maps, the linear-in-parameters regression,
simulation, and the random streams every draw comes from.

Imports only from :mod:`fnsysid.config`.
"""
