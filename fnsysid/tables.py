"""Result tables of a run as tidy DataFrames (one row per observation) and its summary."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .validate import plain


def errors_frame(hist) -> pd.DataFrame:
    """Tidy table: one row per (repeat, round) with the max and mean error over clients."""
    e_max, e_mean = np.array(hist.e_max), np.array(hist.e_mean)   # (rounds, S)
    R1, S = e_max.shape
    return pd.DataFrame({
        "repeat": np.tile(np.arange(S), R1),
        "round": np.repeat(np.arange(R1), S),
        "e_max": e_max.ravel(),
        "e_mean": e_mean.ravel(),
    }).sort_values(["repeat", "round"], kind="stable").reset_index(drop=True)


def clients_frame(hist) -> pd.DataFrame:
    """Tidy table: one row per (repeat, round, client)."""
    e = np.array(hist.per_client)                                 # (rounds, S, M)
    R1, S, M = e.shape
    rr, ss, mm = np.meshgrid(np.arange(R1), np.arange(S), np.arange(M), indexing="ij")
    df = pd.DataFrame({"repeat": ss.ravel(), "round": rr.ravel(), "client": mm.ravel(),
                       "error": e.ravel()})
    return df.sort_values(["repeat", "round", "client"], kind="stable").reset_index(drop=True)


def estimates_frame(model, estimate, data, theta0, per_client: bool) -> pd.DataFrame:
    """Final estimates with the clients' mean truth, the nominal model and the start.

    One row per (repeat, parameter) with ``client = "server"``; a strategy that evaluates each
    client with its own model (``local``) gets one row per client when per-client output is on,
    else its mean over clients (``client = "mean"``).
    """
    S, M, p = data.theta_true.shape
    estimate = np.asarray(estimate)
    if estimate.shape[1] == 1:
        labels, est = ["server"], estimate
    elif per_client:
        labels, est = [str(m) for m in range(M)], estimate
    else:
        labels, est = ["mean"], estimate.mean(axis=1, keepdims=True)
    C = len(labels)
    nominal = model.system.nominal @ model.embed
    return pd.DataFrame({
        "repeat": np.repeat(np.arange(S), C * p),
        "client": np.tile(np.repeat(labels, p), S),
        "parameter": np.tile(model.param_names, S * C),
        "estimate": est.ravel(),
        "true_mean": np.repeat(data.theta_true.mean(axis=1), C, axis=0).ravel(),
        "nominal": np.tile(nominal, S * C),
        "initial": np.repeat(theta0, C, axis=0).ravel(),
    })


def last_round(errors: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``errors.csv`` at the last recorded round (one per repeat)."""
    return errors[errors["round"] == errors["round"].max()]


def run_title(cfg, model) -> str:
    """One-line description of a run's settings (plot titles)."""
    return (f"{model.system.name}, M={cfg.M}, N={cfg.N}, eps={cfg.eps:g}, K={cfg.K}, "
            f"lr={cfg.lr:g}")


def make_summary(cfg, model, diverged, errors, theory, runtime) -> dict:
    """``summary.json``: status, final errors (mean and std over repeats), settings, runtime."""
    last = last_round(errors)
    choices = _choices()
    return {
        "status": "diverged" if diverged is not None else "ok",
        "diverged_round": diverged,
        "rounds_completed": int(errors["round"].max()),
        "final_e_max_mean": float(last["e_max"].mean()),
        "final_e_max_std": float(last["e_max"].std(ddof=0)),
        "final_e_mean_mean": float(last["e_mean"].mean()),
        "final_e_mean_std": float(last["e_mean"].std(ddof=0)),
        "system": choices.get("system", model.system.name),
        "feature_map": choices.get("feature_map"),
        "optimizer": choices.get("optimizer"),
        "strategy": choices.get("strategy"),
        "M": cfg.M, "N": plain(cfg.N),
        "T": cfg.T, "eps": cfg.eps, "K": cfg.K, "lr": cfg.lr, "R": cfg.R,
        "repeats": cfg.repeats, "seed": cfg.seed,
        "parameters": list(model.param_names),
        "runtime_s": {k: round(v, 4) for k, v in runtime.items()},
        "theorem1": {"delta": float(cfg.theory.delta),
                     **{k: float(theory[k].mean()) for k in
                        ("bound_rel", "bound", "noise_term", "sigma_w", "s_phi2", "b_phi", "eps",
                         "N_tot")}},
    }


def _choices() -> dict:
    """Group options chosen on the command line, when running under Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except Exception:
        return {}
