"""Where the rounds run: in process (every client of every repeat in one array) or on Flower
(a ServerApp and one ClientApp per client), and the signals that stop them between rounds.

Imports from every folder below it (results, learning, data, dynamics, config), never from
:mod:`fnsysid.app`.
"""
