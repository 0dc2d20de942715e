"""Your own data through the Python API: CSV logs of a small fleet -> FedAvg -> held-out fit.

Writes one CSV per robot (columns trajectory, t, x1, x2, u) into a folder, identifies
``x+ = Theta phi(x, u)`` with cubic polynomial features by FedAvg, prints the final held-out
NRMSE and saves the held-out fit plot. No ground truth is used.

    python examples/own_data.py [OUT_DIR]      # default: outputs/own_data
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

import fnsysid


def write_logs(folder: Path, n_robots: int = 5, n_traj: int = 6, length: int = 60,
               seed: int = 0) -> None:
    """Damped pendulum-like robots that differ in stiffness and gain, one CSV each."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    dt = 0.1
    for r in range(n_robots):
        stiffness, gain = 1.0 + 0.1 * rng.random(), 0.5 + 0.05 * rng.random()
        rows = []
        for j in range(n_traj):
            x = rng.uniform(-1.0, 1.0, 2)
            for t in range(length):
                u = rng.uniform(-1.0, 1.0)
                rows.append((j, round(t * dt, 3), x[0], x[1], u))
                x = np.array([x[0] + dt * x[1],
                              x[1] + dt * (-stiffness * np.sin(x[0]) - 0.2 * x[1] + gain * u)])
                x += 0.002 * rng.standard_normal(2)               # process noise
        pd.DataFrame(rows, columns=["trajectory", "t", "x1", "x2", "u"]).to_csv(
            folder / f"robot{r}.csv", index=False)


def main(out: Path) -> dict:
    logs = out / "logs"
    write_logs(logs)
    data = fnsysid.load_trajectories(logs, states=["x1", "x2"], inputs=["u"])
    print(f"{data['client'].nunique()} robots, {len(data)} samples")
    result = fnsysid.run({
        "system": "generic", "data": "files", "data.path": str(logs),
        "data.states": ["x1", "x2"], "data.inputs": ["u"], "data.holdout": 0.2,
        "feature_map": "polynomial", "feature_map.degree": 3,
        "strategy": "fedavg", "R": 30, "progress": False,
    })
    s = result.summary
    print(f"final held-out NRMSE (max over robots): one-step {s['final_nrmse_1step_max']:.4f}, "
          f"free run {s['final_nrmse_sim_max']:.4f}")
    result.plot_fit(path=out / "fit.png")
    print(f"held-out fit: {out / 'fit.png'}")
    return s


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("outputs/own_data"))
