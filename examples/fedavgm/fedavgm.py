"""FedAvg with server momentum (FedAvgM, Hsu, Qi and Brown 2019): a strategy of your own,
outside the fnsysid package.

The clients' part is FedAvg's (K local steps from the server model); the server treats the
change of the average as a pseudo-gradient and moves with momentum::

    d = theta_s - mean_i theta_i          v <- beta v + d          theta_s <- theta_s - eta v

``beta = 0, eta = 1`` is FedAvg. Only :meth:`server_update` (and the server's state ``v``) is
new, so the same class runs in process and on Flower. Use it with its YAML in
``conf/strategy/fedavgm.yaml`` (see docs/EXTENDING.md, "A strategy")::

    PYTHONPATH=examples/fedavgm python run.py --config-dir examples/fedavgm/conf strategy=fedavgm
"""

from __future__ import annotations

import numpy as np

from fnsysid.learning.strategies import FedAvg, aggregate


class FedAvgM(FedAvg):
    """FedAvg whose server moves with momentum ``beta`` and step size ``eta``."""

    def __init__(self, beta: float = 0.5, eta: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
            raise ValueError(f"strategy.beta={beta}; allowed: a number in [0, 1)")
        if not (isinstance(eta, (int, float)) and eta > 0):
            raise ValueError(f"strategy.eta={eta}; allowed: a number > 0")
        self.beta, self.eta = float(beta), float(eta)

    def setup_server(self, theta0, n, seed=0):
        super().setup_server(theta0, n, seed)
        self.v = np.zeros(self.server.shape)              # the server's momentum, (S, p)

    def server_update(self, exchange, replies, sel=slice(None), active=None):
        average = aggregate(replies["theta"], self.weights_of(sel, active))
        self.v = self.beta * self.v + (self.server - average)
        self.server = self.server - self.eta * self.v
