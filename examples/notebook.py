# %% [markdown]
# # A fleet in DataFrames: fit, predict, simulate, score, print
#
# A notebook in percent format (open it in Jupyter with jupytext, or in VS Code / Spyder as
# cells; `python examples/notebook.py [OUT_DIR]` runs it as a script). Five robots log
# trajectories of a damped oscillator that differ a little in stiffness and gain; fnsysid
# identifies `x+ = Theta phi(x, u)` with quadratic features by FedAvg, from the DataFrame in
# memory: nothing is written to disk.

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import fnsysid

# run as a script (`python examples/notebook.py OUT_DIR`), the figure is saved in OUT_DIR; in a
# notebook it is shown below its cell and nothing is written
as_script = __name__ == "__main__" and "ipykernel" not in sys.modules
out = Path(sys.argv[1]) if as_script and len(sys.argv) > 1 else None
if out is not None:
    out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
rows = []
for robot in range(5):
    stiffness, gain = 1.0 + 0.1 * rng.random(), 0.5 + 0.05 * rng.random()
    for j in range(6):
        x = rng.uniform(-1.0, 1.0, 2)
        for t in range(40):
            u = rng.uniform(-1.0, 1.0)
            rows.append((f"robot{robot}", j, round(0.1 * t, 3), x[0], x[1], u))
            x = np.array([x[0] + 0.1 * x[1],
                          x[1] + 0.1 * (-stiffness * x[0] - 0.2 * x[1] + gain * u)])
            x += 0.002 * rng.standard_normal(2)
df = pd.DataFrame(rows, columns=["client", "trajectory", "t", "x1", "x2", "u"])
df["split"] = np.where(df["trajectory"] == 5, "val", "train")     # the last one held out
df.head()

# %% [markdown]
# ## Fit
# Keyword arguments are the command line's knobs and groups; `config=` takes any other
# setting. `fit` returns the estimator; its short repr gives the run's status and held-out
# scores.

# %%
model = fnsysid.FederatedSysID(feature_map="polynomial", strategy="fedavg", R=60,
                               progress=False,
                               config={"feature_map.degree": 2,
                                       "optimizer.scale_features": "whiten"})
model.fit(df, states=["x1", "x2"], inputs=["u"])
print(repr(model))

# %% [markdown]
# ## The identified model

# %%
print(model)                        # the equations, one per state
model.coefficients().head()

# %% [markdown]
# ## Held-out data: one-step predictions and free run against the measurements

# %%
val = df[df["split"] == "val"]
pred, sim = model.predict(val), model.simulate(val)
print(f"held-out NRMSE: one-step {model.nrmse(val):.4f}, "
      f"free run {model.nrmse(val, kind='free_run'):.4f}")
one = val["client"] == "robot0"
fig, axes = plt.subplots(2, 1, sharex=True, figsize=(8, 4.5), layout="constrained")
for ax, state in zip(axes, ["x1", "x2"], strict=True):
    ax.plot(val.loc[one, "t"], val.loc[one, state], "k.", label="measured")
    ax.plot(pred.loc[one, "t"], pred.loc[one, state], "-", label="one-step prediction")
    ax.plot(sim.loc[one, "t"], sim.loc[one, state], "--", label="free run")
    ax.set_ylabel(state)
axes[0].legend(loc="best")
axes[-1].set_xlabel("t")
axes[0].set_title("robot0, held-out trajectory")
if out is not None:
    fig.savefig(out / "notebook_fit.png", dpi=100)

# %% [markdown]
# ## Per-round history (the command line's errors.csv)

# %%
model.history_[["round", "nrmse_1step_mean", "nrmse_sim_mean"]].dropna().tail()
