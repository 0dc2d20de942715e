"""One experiment: build the clients from a config, run the rounds, write the results.

``run_experiment(cfg, output_dir)`` is what ``run.py`` calls; tests call it directly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from .model import ClientData, FeatureMapError, Model, build_model, generate
from .theory import theorem1
from .validate import ConfigError, check_run, plain

#: keys of a system config that configure the run, not the system object
SYSTEM_RUN_KEYS = ("knobs", "solver", "init")


def _build(node, what: str, drop=()):
    """Instantiate a config group node, turning constructor errors into ConfigError."""
    cfg = OmegaConf.to_container(node, resolve=True)
    for k in drop:
        cfg.pop(k, None)
    try:
        return instantiate(cfg, _convert_="all")
    except Exception as exc:  # hydra wraps constructor errors; report the root cause
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        raise ConfigError(f"{what}: {root}") from exc


def build(cfg: DictConfig):
    """Build (model, optimizer, strategy) from a composed config."""
    system = _build(cfg.system, "system", SYSTEM_RUN_KEYS)
    library = None
    if cfg.feature_map.get("_target_"):
        library = _build(cfg.feature_map, "feature_map")
    try:
        model = build_model(system, library)
    except FeatureMapError as exc:
        name = _option_name("feature_map", cfg.feature_map)
        raise ConfigError(f"feature_map={name} does not fit system={system.name}: {exc}; "
                          f"options that fit: {', '.join(fitting_feature_maps(system))}") from exc
    optimizer = _build(cfg.optimizer, "optimizer")
    strategy = _build(cfg.strategy, "strategy")
    return model, optimizer, strategy


def _option_name(group: str, node) -> str:
    """Name of the group option whose YAML equals ``node`` ("custom" if none does)."""
    from .cli import CONF_DIR, options

    plain = OmegaConf.to_container(node, resolve=True)
    for name in options(group):
        if OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml")) == plain:
            return name
    return "custom"


def fitting_feature_maps(system) -> list[str]:
    """Options of the feature_map group that can represent ``system``."""
    from .cli import CONF_DIR, options

    fit = []
    for name in options("feature_map"):
        node = OmegaConf.load(CONF_DIR / "feature_map" / f"{name}.yaml")
        lib = instantiate(node, _convert_="all") if node.get("_target_") else None
        try:
            build_model(system, lib)
            fit.append(name)
        except FeatureMapError:
            pass
    return fit


def initial_model(model: Model, data: ClientData, init) -> np.ndarray:
    """Server model of round 0, (S, p): ``init.scale`` times the nominal model or client 0's."""
    ref = init.get("reference", "nominal")
    if ref == "nominal":
        base = np.broadcast_to(model.system.nominal @ model.embed, (data.shape[0], model.p))
    elif ref == "client0":
        base = data.theta_true[:, 0]
    else:
        raise ConfigError(f"system.init.reference={ref} is not allowed; allowed: nominal, client0")
    return float(init.get("scale", 0.0)) * np.array(base)


def client_errors(estimate: np.ndarray, theta_true: np.ndarray) -> np.ndarray:
    """Paper eq. 9: ``||theta_hat - theta_i*|| / ||theta_i*||`` per repeat and client, (S, M).

    ``estimate`` broadcasts against ``theta_true`` (S, M, p); the norm is the Euclidean norm of
    the parameter vector (the Frobenius norm for matrix parameters).
    """
    return np.linalg.norm(estimate - theta_true, axis=-1) / np.linalg.norm(theta_true, axis=-1)


@dataclass
class History:
    """Errors per round: aggregates over clients (R+1, S) and optionally per client."""

    e_max: list = field(default_factory=list)
    e_mean: list = field(default_factory=list)
    per_client: list | None = None

    def record(self, e: np.ndarray) -> None:
        self.e_max.append(e.max(axis=1))
        self.e_mean.append(e.mean(axis=1))
        if self.per_client is not None:
            self.per_client.append(e.copy())


def train(strategy, data: ClientData, theta0, optimizer, model, cfg, progress=True,
          keep_clients=False):
    """Run R rounds; stop at the first round whose model is not finite.

    Returns (history, diverged_round or None).
    """
    strategy.setup(theta0, data, model, optimizer, cfg.K, cfg.lr, cfg.seed)
    hist = History(per_client=[] if keep_clients else None)
    hist.record(client_errors(strategy.estimate(), data.theta_true))
    diverged = None
    with np.errstate(over="ignore", invalid="ignore"):
        for r in tqdm(range(1, cfg.R + 1), desc="rounds", unit="round", leave=False,
                      disable=None if progress else True):
            strategy.round(r)
            e = client_errors(strategy.estimate(), data.theta_true)
            if not np.isfinite(e).all():
                diverged = r
                break
            hist.record(e)
    return hist, diverged


def keep_per_client(cfg) -> bool:
    flag = cfg.output.per_client
    if flag == "auto":
        return cfg.M <= cfg.output.per_client_max
    return bool(flag)


def run_experiment(cfg: DictConfig, output_dir: str | Path) -> dict:
    """Run the experiment described by ``cfg`` and write its results into ``output_dir``.

    Files: ``config.yaml`` (resolved), ``errors.csv`` (repeat, round, e_max, e_mean),
    ``clients.csv`` (repeat, round, client, error; small M or ``output.per_client=true``),
    ``estimates.csv`` (final server estimate per repeat and parameter), ``theory.csv`` (the
    right-hand side of Theorem 1 per repeat, see :mod:`fnsysid.theory`), ``summary.json`` and
    ``error.png``. Returns the summary. Raises :class:`ConfigError` before writing anything if
    a setting is not allowed.
    """
    t_start = time.perf_counter()
    check_run(cfg)
    model, optimizer, strategy = build(cfg)
    out = Path(output_dir)

    t0 = time.perf_counter()
    data = generate(model, cfg.M, plain(cfg.N), cfg.T, cfg.eps, cfg.repeats, cfg.seed,
                    keep_samples=optimizer.needs_samples,
                    shared_noise=bool(cfg.data.shared_noise))
    theta0 = initial_model(model, data, cfg.system.init)
    t_data = time.perf_counter() - t0

    t0 = time.perf_counter()
    keep_clients = keep_per_client(cfg)
    hist, diverged = train(strategy, data, theta0, optimizer, model, cfg,
                           progress=cfg.progress, keep_clients=keep_clients)
    t_train = time.perf_counter() - t0
    theory = theorem1(data, model, float(cfg.theory.delta))

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    errors = errors_frame(hist)
    errors.to_csv(out / "errors.csv", index=False)
    if keep_clients:
        clients_frame(hist).to_csv(out / "clients.csv", index=False)
    if diverged is None:
        estimates_frame(model, strategy.estimate(), data, theta0,
                        keep_clients).to_csv(out / "estimates.csv", index=False)
    theory.to_csv(out / "theory.csv", index=False)
    summary = make_summary(cfg, model, diverged, errors, theory,
                           runtime=dict(data_s=t_data, train_s=t_train,
                                        total_s=time.perf_counter() - t_start))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if diverged is None and cfg.output.plot:
        from .plotting import plot_run

        plot_run(errors, out / "error.png", title=run_title(cfg, model))
    return summary


def run_title(cfg, model) -> str:
    return (f"{model.system.name}, M={cfg.M}, N={cfg.N}, eps={cfg.eps:g}, K={cfg.K}, "
            f"lr={cfg.lr:g}")


def errors_frame(hist: History) -> pd.DataFrame:
    """Tidy table: one row per (repeat, round) with the max and mean error over clients."""
    e_max, e_mean = np.array(hist.e_max), np.array(hist.e_mean)   # (rounds, S)
    R1, S = e_max.shape
    return pd.DataFrame({
        "repeat": np.tile(np.arange(S), R1),
        "round": np.repeat(np.arange(R1), S),
        "e_max": e_max.ravel(),
        "e_mean": e_mean.ravel(),
    }).sort_values(["repeat", "round"], kind="stable").reset_index(drop=True)


def clients_frame(hist: History) -> pd.DataFrame:
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


def make_summary(cfg, model, diverged, errors, theory, runtime) -> dict:
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
