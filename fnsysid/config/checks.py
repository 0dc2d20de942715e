"""The check of a composed run config: its types and ranges (:mod:`fnsysid.config.schema`),
then the rules that tie settings together; each failing with one line naming the setting."""

from __future__ import annotations

from collections.abc import Mapping

from fnsysid.config.errors import ConfigError, DataError, one_line, show
from fnsysid.config.messages import field_words
from fnsysid.config.schema import KNOBS, Settings, System, settings_from

__all__ = ["KNOBS", "ConfigError", "DataError", "check_run", "check_batch_size",
           "override_key"]

#: knobs that describe simulated data; with data=files the files give them
FILE_KNOBS = ("N", "T", "eps")


def check_run(cfg) -> Settings:
    """The typed settings of a composed run config (a ``DictConfig``, or plain Python as
    ``OmegaConf.to_container(cfg, resolve=False)`` gives it), after every check; a
    :class:`Settings` (e.g. from :func:`~fnsysid.config.schema.settings_from` of resolved
    settings) is checked again for the rules between settings only."""
    if isinstance(cfg, Settings):
        settings, raw = cfg, None        # the file knobs were checked when it was made
    else:
        raw, plain = _plain(cfg)
        settings = settings_from(plain)
    _check_together(settings, raw)
    return settings


def _plain(cfg) -> tuple[dict, dict]:
    """(unresolved, resolved) plain dicts of ``cfg`` without Hydra's node; keys whose
    absence would make an interpolation fail obscurely are named first."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):
        raw = OmegaConf.to_container(cfg, resolve=False)
    else:
        raw = dict(cfg)
    raw.pop("hydra", None)
    _check_present(raw)
    if not isinstance(cfg, DictConfig):
        return raw, raw
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(one_line(exc)) from exc
    plain.pop("hydra", None)
    return raw, plain


def _check_present(raw: Mapping) -> None:
    """Missing top-level keys, and the keys every system YAML needs (``knobs``, ``solver``,
    ``init``), before interpolations into them fail obscurely."""
    for name, info in Settings.model_fields.items():
        if name not in raw and info.is_required():
            raise ConfigError(f"setting '{name}' is missing (removed with ~?); it is required: "
                              f"{field_words(info)}")
    system = raw.get("system")
    if not isinstance(system, Mapping):
        return
    for name in System.RUN_KEYS:
        info = System.model_fields[name]
        sub = system.get(name)
        keys = list(info.annotation.model_fields)
        if sub is None:
            raise ConfigError(f"system.{name} is missing: every system's YAML needs {name}: "
                              f"a group of settings ({', '.join(keys)}) (see docs/EXTENDING.md)")
        required = [k for k, f in info.annotation.model_fields.items() if f.is_required()]
        optional = [k for k in keys if k not in required]
        missing = [k for k in required if isinstance(sub, Mapping) and k not in sub]
        if missing:
            also = f" (and may have {', '.join(optional)})" if optional else ""
            raise ConfigError(f"system.{name}.{missing[0]} is missing: system.{name} needs "
                              f"{', '.join(required)}{also} (see docs/EXTENDING.md)")


def _check_together(s: Settings, raw: Mapping | None) -> None:
    """The rules between settings (``raw``: the unresolved config, if at hand)."""
    if s.files:
        if raw is not None:
            check_file_knobs(raw)
    else:
        for key in ("M", "repeats"):
            if getattr(s, key) is None:
                raise ConfigError(f"{key}=null is not allowed: {key} ({KNOBS[key]}) must be an "
                                  "integer >= 1 (null only with data=files, whose files give it)")
    if isinstance(s.N, list) and len(s.N) != s.M and not s.files:
        raise ConfigError(f"N has {len(s.N)} entries but M={s.M}: a list N gives one "
                          "trajectory count per client")
    if isinstance(s.K, list) and len(s.K) != s.M and not s.files:
        raise ConfigError(f"K has {len(s.K)} entries but M={s.M}: a list K gives one "
                          "step count per client")
    check_sparsity(s)
    check_privacy(s)
    check_secure_aggregation(s)
    batch_size = getattr(s.optimizer, "batch_size", None)
    if not isinstance(s.K, int) and batch_size is not None:
        raise ConfigError("a list or distribution K (per-client local steps) needs "
                          "optimizer=gd")
    if batch_size is not None and not s.files:
        # with data from files the check runs once the files are read
        check_batch_size(batch_size, (min(s.N) if isinstance(s.N, list) else s.N) * s.T)


def check_sparsity(s: Settings) -> None:
    """``sparsity=stlsq`` needs a server model (not ``strategy=local``), no ``finetune``
    (its local steps would fit every term; ``auto`` personalizes on the support) and, with a
    strategy that iterates, local
    steps on the coefficients themselves (not ``scale_features=zscore``). The closed-form
    strategies (``oneshot``,
    ``centralized_exact``) take no local steps, so the optimizer's settings do not matter
    to them."""
    sp = s.sparsity
    if sp.name == "none":
        return
    strategy = s.resolved.get("strategy") or {}
    target = str(strategy.get("_target_", ""))
    if target.endswith(".Local"):
        raise ConfigError("sparsity=stlsq with strategy=local: every client keeps its own "
                          "model, there is no server model to prune; allowed: a strategy with "
                          "a server model (fedavg, fedprox, fedlin, scaffold, fednova, oneshot, "
                          "centralized, centralized_exact, cyclic) or sparsity=none")
    if s.personalize.name == "finetune":
        raise ConfigError("sparsity=stlsq with personalize=finetune: its local steps would "
                          "fit every term, not the pruned support; allowed with "
                          "sparsity=stlsq: personalize=none or auto (each client's own values "
                          "on the shared support)")
    closed = target.endswith(".OneShot") or strategy.get("exact") is True
    if (s.resolved.get("optimizer") or {}).get("scale_features") == "zscore" and not closed:
        raise ConfigError("sparsity=stlsq with optimizer.scale_features=zscore: the centred "
                          "loss of the local steps mixes the pruned terms back into the kept "
                          "ones; allowed: optimizer.scale_features=none, diagonal or whiten, "
                          "or a strategy without local steps (oneshot, centralized_exact)")
    if s.runtime.name == "flower" and sp.alpha:
        raise ConfigError(f"sparsity.alpha={sp.alpha} is not allowed with runtime=flower: a "
                          "client's share of the ridge needs every client's sample count; "
                          "allowed: sparsity.alpha=0 (or runtime=inprocess)")


def check_privacy(s: Settings) -> None:
    """``privacy=central`` or ``local`` (docs/PRIVACY.md) runs with the strategies whose
    release it perturbs (``centralized_exact``, ``oneshot`` with uniform weights), in process,
    without a sparsity loop or empirical-Bayes personalization (both read the clients' exact
    statistics), with exactly one of ``epsilon`` and ``noise_multiplier``."""
    pv = s.privacy
    if pv.name == "none":
        return
    strategy = s.resolved.get("strategy") or {}
    target = str(strategy.get("_target_", ""))
    oneshot = target.endswith(".OneShot")
    rounds = target.rsplit(".", 1)[-1] in ("FedAvg", "FedProx", "FedNova")
    if not (oneshot or rounds
            or (target.endswith(".Centralized") and strategy.get("exact") is True)):
        raise ConfigError(f"privacy={pv.name} is not allowed with this strategy "
                          f"({target or 'custom'}); allowed: strategy=centralized_exact, "
                          "oneshot, fedavg, fedprox or fednova (or privacy=none)")
    if (oneshot or rounds) and strategy.get("weighting") == "samples":
        raise ConfigError(f"privacy={pv.name} with strategy.weighting=samples: a client's weight "
                          "would be its sample count, unbounded; allowed: "
                          "strategy.weighting=uniform (or privacy=none)")
    if s.runtime.name == "flower":
        check_flower_privacy(s, target)
    elif s.runtime.name != "inprocess":
        raise ConfigError(f"privacy={pv.name} is not allowed with runtime={s.runtime.name}; "
                          "allowed: runtime=inprocess (or privacy=none)")
    for group, bad in (("sparsity", s.sparsity.name != "none"),
                       ("personalize", s.personalize.name == "auto")):
        if bad:
            raise ConfigError(f"privacy={pv.name} with {group}={getattr(s, group).name}: it "
                              "reads the clients' exact statistics; allowed: "
                              f"{group}=none (or privacy=none)")
    if (pv.epsilon is None) == (pv.noise_multiplier is None):
        raise ConfigError("privacy.epsilon and privacy.noise_multiplier: exactly one must be "
                          "given (the other null); allowed: privacy.epsilon=E (the noise is "
                          "solved for it) or privacy.epsilon=null privacy.noise_multiplier=Z "
                          "(its epsilon reported)")


#: the strategies whose train exchange runs as a Flower workflow round (SecAgg+, Flower's DP):
#: one reply (the local model) whose plain mean is the server's update
WORKFLOW_STRATEGIES = ("FedAvg", "FedProx")


def _workflow_refusal(s: Settings, target: str, what: str, allowed: str) -> None:
    """The refusals shared by SecAgg+ and Flower's central DP (``what`` names the setting):
    both run the train exchange as a round of Flower's legacy workflow, whose clients send one
    list of arrays with one weight and whose server takes the plain mean of the round."""
    name = target.rsplit(".", 1)[-1]
    strategy = s.resolved.get("strategy") or {}
    if name not in WORKFLOW_STRATEGIES:
        why = ("its statistics travel in query messages, which Flower's mods pass through "
               "untouched (secaggplus_mod and fixedclipping_mod act on train messages only)"
               if name in ("OneShot", "Centralized") else
               "its server update is not the plain mean of one reply per client (Flower's "
               "workflow aggregates the parameters of each client's FitRes into one mean)")
        raise ConfigError(f"{what} with strategy {name or 'custom'}: {why}; allowed: "
                          f"strategy=fedavg or fedprox ({allowed})")
    if strategy.get("weighting") == "samples":
        raise ConfigError(f"{what} with strategy.weighting=samples: Flower's workflow weighs "
                          "a client's reply by one number for all repeats (FitRes.num_examples);"
                          f" allowed: strategy.weighting=uniform ({allowed})")
    if float(strategy.get("fraction", 1.0)) < 1.0:
        raise ConfigError(f"{what} with strategy.fraction={strategy.get('fraction')}: the "
                          "clients of a repeat differ between repeats, and Flower's workflow "
                          "averages one set of replies; allowed: strategy.fraction=1 "
                          f"({allowed})")
    for group, bad in (("sparsity", s.sparsity.name != "none"),
                       ("personalize", s.personalize.name != "none")):
        if bad:
            raise ConfigError(f"{what} with {group}={getattr(s, group).name}: its exchanges "
                              "carry each client's own statistics or model, which Flower's "
                              f"workflow does not aggregate; allowed: {group}=none ({allowed})")


def check_flower_privacy(s: Settings, target: str) -> None:
    """``privacy=central`` with ``runtime=flower`` runs DP-FedAvg with Flower's blocks
    (``fixedclipping_mod`` on the clients, ``DifferentialPrivacyClientSideFixedClipping`` on
    the server, fnsysid/runtimes/flower_secure.py): fedavg or fedprox with every client a
    round and one repeat (the mod clips the whole update, all repeats, by one norm)."""
    pv = s.privacy
    allowed = "or runtime=inprocess"
    if pv.name != "central":
        raise ConfigError(f"privacy={pv.name} is not allowed with runtime=flower: Flower's "
                          "central DP blocks add the noise on the server; allowed: "
                          f"privacy=central ({allowed})")
    _workflow_refusal(s, target, "privacy=central with runtime=flower", allowed)
    if s.repeats != 1:
        raise ConfigError(f"privacy=central with runtime=flower and repeats={s.repeats}: "
                          "Flower's fixedclipping_mod clips a client's whole update (all "
                          "repeats) by one norm, DP-FedAvg clips each repeat's; allowed: "
                          "repeats=1 (or runtime=inprocess)")


def check_secure_aggregation(s: Settings) -> None:
    """``runtime.secure_aggregation=true`` (Flower's SecAgg+, fnsysid/runtimes/
    flower_secure.py): fedavg or fedprox with uniform weights and every client a round, at
    least 2 clients (SecAgg+ halts with fewer: "The number of samples should be greater than
    1"), and M times ``quantization_range`` below SecAgg+'s modulus 2^32 (the sum of the
    quantized replies must not wrap around)."""
    rt = s.runtime
    if not getattr(rt, "secure_aggregation", False):
        return
    what, allowed = "runtime.secure_aggregation=true", "or runtime.secure_aggregation=false"
    target = str((s.resolved.get("strategy") or {}).get("_target_", ""))
    _workflow_refusal(s, target, what, allowed)
    if s.M is not None and s.M < 2:
        raise ConfigError(f"{what} with M={s.M}: SecAgg+ needs at least 2 clients (Flower: "
                          "'The number of samples should be greater than 1.'); allowed: M >= 2 "
                          f"({allowed})")
    Q = rt.secagg.quantization_range
    if s.M is not None and s.M * Q >= 2 ** 32:
        raise ConfigError(f"runtime.secagg.quantization_range={Q} with M={s.M}: the sum of M "
                          "quantized replies reaches SecAgg+'s modulus 2^32 and wraps around; "
                          f"allowed: runtime.secagg.quantization_range < {2 ** 32 // s.M} "
                          "(2^32 / M)")


def unused_settings(s: Settings, given) -> list[str]:
    """The settings in ``given`` (those given explicitly) that the run does not use: ``K``,
    ``lr`` and the optimizer's with a closed-form strategy (``oneshot``,
    ``centralized_exact``: no local steps), ``sparsity.unbias`` without a ridge
    (``sparsity.alpha=0``: nothing to unbias), ``sparsity.margin`` with a fixed threshold
    (nothing is chosen), ``output.ci_level`` where nothing has
    intervals (an iterative strategy without ``personalize=auto``). Not refused: a sweep
    over strategies gives every job the same ``K`` and ``lr``."""
    strategy = s.resolved.get("strategy") or {}
    target = str(strategy.get("_target_", ""))
    closed = target.endswith(".OneShot") or strategy.get("exact") is True
    out = []
    if closed:
        out += [k for k in sorted(given) if k in ("K", "lr") or k == "optimizer"
                or k.startswith("optimizer.")]
    if s.sparsity.name != "none" and not s.sparsity.alpha and "sparsity.unbias" in given:
        out.append("sparsity.unbias")
    if (s.sparsity.name != "none" and s.sparsity.threshold != "auto"
            and "sparsity.margin" in given):
        out.append("sparsity.margin")
    if "output.ci_level" in given and not closed and s.personalize.name != "auto":
        out.append("output.ci_level")
    return out


def unused_line(unused: list[str], strategy: str | None) -> str:
    """The log line naming :func:`unused_settings`' result (``strategy``: the strategy's
    option name) and why each does nothing."""
    why = []
    steps = [k for k in unused
             if k not in ("sparsity.unbias", "sparsity.margin", "output.ci_level")]
    if steps:
        why.append(f"{', '.join(steps)}: strategy={strategy} is solved in closed form, "
                   "without local steps")
    if "sparsity.unbias" in unused:
        why.append("sparsity.unbias: sparsity.alpha=0 fits the kept terms without a ridge, "
                   "so there is nothing to unbias")
    if "sparsity.margin" in unused:
        why.append("sparsity.margin: only sparsity.threshold=auto chooses between candidates")
    if "output.ci_level" in unused:
        why.append(f"output.ci_level: strategy={strategy} gives no intervals (an iterate of "
                   "gradient steps; oneshot, centralized_exact and personalize=auto have "
                   "them)")
    return ("settings given that have no effect on this run (summary.json: unused_settings): "
            + "; ".join(why))


def check_file_knobs(raw: Mapping) -> None:
    """With ``data=files``, refuse a value given for N, T or eps: the trajectories, their
    length and the clients' systems come from the files, so the value would be ignored.

    ``raw``: the unresolved settings; a knob left at its default is still the interpolation
    ``${system.knobs.<name>}``.
    """
    for key in FILE_KNOBS:
        value = raw.get(key)
        if key in raw and not (isinstance(value, str) and value.startswith("${")):
            raise ConfigError(f"{key}={show(value)} does not apply with data=files: "
                              "the trajectories, their length and the clients' systems come "
                              "from the files; drop it")


def check_batch_size(bs, n_min: int | None = None) -> None:
    """``optimizer.batch_size`` must lie in ``1..N*T`` (``n_min`` = smallest N_i T, if known)."""
    ok = isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1
    if not (ok and (n_min is None or bs <= n_min)):
        upper = "N*T" if n_min is None else f"N*T = 1..{n_min}"
        raise ConfigError(f"optimizer.batch_size={bs} is not allowed: it must be an integer in "
                          f"1..{upper}")


def override_key(line: str) -> str:
    """The setting an override line names: ``M`` for ``M=5``, ``+data.x=1`` or ``~M``."""
    return str(line).split("=", 1)[0].lstrip("+~")
