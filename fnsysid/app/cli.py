"""Command line: check the overrides (:mod:`fnsysid.app.preflight`), then run them. A single
run is run here with the config the check composed (:func:`run_once`: one composition); a
sweep, ``--help``, ``--cfg`` and the other commands go to Hydra's entry point (:data:`task`),
which calls :func:`run_task` for each job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from fnsysid.app.callbacks import release, sweep_exit
from fnsysid.app.preflight import check, config_folder
from fnsysid.config.argv import (
    absolute_config_path,
    check_commands,
    flag_value,
    flags_first,
    is_multirun,
)
from fnsysid.config.checks import ConfigError
from fnsysid.config.groups import CONF_DIR, HYDRA_LOCK
from fnsysid.results.atomic import WriteError, write_json
from fnsysid.results.folder import clear_results, finished_ok, input_paths
from fnsysid.runtimes import interrupt

log = logging.getLogger("fnsysid")


#: the deepest folder on the way to the results folder that existed before this command (set
#: by :func:`main` from the pre-run check): a refused run removes only what was made below it
_EXISTED: Path | None = None


def _remove_outputs(job_dir: Path) -> None:
    """Remove what Hydra made for a run that was refused: the job folder and the folders above
    it that are left empty (or hold only ``multirun.yaml``), up to the folder that existed
    before the command; a results folder that existed keeps everything but Hydra's records."""
    job_dir = Path(job_dir).resolve()
    if _EXISTED is None or not (job_dir == _EXISTED or _EXISTED in job_dir.parents):
        # no record of the check (a worker process, a call from Python)
        shutil.rmtree(job_dir, ignore_errors=True)
        parent = job_dir.parent
        if parent.exists() and {p.name for p in parent.iterdir()} <= {"multirun.yaml"}:
            shutil.rmtree(parent, ignore_errors=True)
        return
    if job_dir == _EXISTED:
        shutil.rmtree(job_dir / ".hydra", ignore_errors=True)
        (job_dir / "run.log").unlink(missing_ok=True)
        return
    shutil.rmtree(job_dir, ignore_errors=True)
    folder = job_dir.parent
    while folder != _EXISTED and folder.is_dir() and \
            {p.name for p in folder.iterdir()} <= {"multirun.yaml"}:
        shutil.rmtree(folder, ignore_errors=True)
        folder = folder.parent


def _resolved(cfg: DictConfig) -> dict:
    """The job's run config resolved into plain Python, without Hydra's node."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return plain


def _print_model(out: Path) -> None:
    """Log the run's identified model (``equations.txt``), in its short form when large."""
    from fnsysid.results.equations import short_form

    path = out / "equations.txt"
    if path.is_file():
        lines = path.read_text().splitlines()
        log.info("identified model (%s):\n%s", path,
                 "\n".join(f"  {ln}" for ln in short_form(lines, str(path))))


def run_task(cfg: DictConfig) -> float | None:
    """One Hydra job: run the experiment into Hydra's output folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fnsysid.app.experiment import run_experiment
    from fnsysid.results.personal import reml_line

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    if cfg.output.resume and finished_ok(out, _resolved(cfg)):
        summary = json.loads((out / "summary.json").read_text())
        log.info("already done (summary ok, same config), skipped: %s", out)
        return summary.get("final_e_max_mean")
    if cfg.output.overwrite or cfg.output.resume:
        cleared = clear_results(out, input_paths(cfg.data))
        if cleared:
            log.info("cleared the earlier results in %s: %s", out, ", ".join(cleared))
    interrupt.job_handlers()
    try:
        summary = run_experiment(cfg, out)
    except ConfigError as exc:
        if hc.mode == RunMode.MULTIRUN:     # a combination the preflight did not reach:
            log.error("refused: %s", exc)   # mark the job; the sweep ends with exit 2
            write_json(out / "summary.json", {"status": "refused", "error": str(exc)})
            return None
        _remove_outputs(out)
        print(f"fnsysid: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except WriteError as exc:      # disk full, folder made read-only during the run
        print(f"fnsysid: error: {exc}; {out} is incomplete (no summary.json)", file=sys.stderr)
        sys.exit(2)
    finally:
        interrupt.job_done()
    log.info("results: %s", out)
    if summary["status"] == "interrupted":
        signum = interrupt.requested()
        cause = f" ({summary['error']})" if summary.get("error") else ""
        print(f"fnsysid: interrupted by {summary['interrupted_by']}{cause} after round "
              f"{summary['rounds_completed']} of {cfg.R}: rows so far in {out} (status: "
              "interrupted)", file=sys.stderr)
        sys.exit(1 if signum is None else interrupt.exit_code(signum))   # 1: a node failed
    if summary["status"] == "ill_conditioned":
        log.error("the estimate is not meaningful (status: ill_conditioned): rows in %s", out)
        if hc.mode == RunMode.RUN:
            sys.exit(3)
        return None
    if summary["status"] not in ("ok", "growing"):
        log.error(divergence_line(summary, cfg.lr))
        if hc.mode == RunMode.RUN:
            sys.exit(3)
        return None
    if summary["final_e_max_mean"] is not None:
        log.info("final e_R at R=%d (max over clients; mean +- std over %d repeats): %.4f +- "
                 "%.4f | mean over clients: %.4f", cfg.R, summary["repeats"],
                 summary["final_e_max_mean"], summary["final_e_max_std"],
                 summary["final_e_mean_mean"])
    if summary.get("final_e_pers_max_mean") is not None:
        log.info("personalized models (personalize=%s; max over clients, mean over repeats): "
                 "%.4f | mean over clients: %.4f; client_estimates.csv",
                 summary["personalize"], summary["final_e_pers_max_mean"],
                 summary["final_e_pers_mean_mean"])
    line = reml_line(summary.get("personalize_reml"))
    if line:
        log.info(line)
    if summary["final_nrmse_1step_max"] is not None:
        whose = ("" if summary.get("personalize", "none") == "none" else
                 " of the run's estimate, not of the personalized models")
        log.info("final held-out NRMSE%s (max | mean over clients, mean over repeats): one-step "
                 "%.4f | %.4f, free run %.4f | %.4f", whose, summary["final_nrmse_1step_max"],
                 summary["final_nrmse_1step_mean"], summary["final_nrmse_sim_max"],
                 summary["final_nrmse_sim_mean"])
    _print_model(out)
    if summary["status"] == "growing":
        from fnsysid.results.history import growth_line

        log.warning(growth_line(summary["growth"], summary["rounds_completed"],
                                lr_advice(summary, cfg.lr)))
        if hc.mode == RunMode.RUN:
            sys.exit(3)
        return None
    judged = summary.get("client_models") or {}
    # logged by the run, each its line; the clients' own least squares are a diagnostic
    if any(j["status"] != "ok" for k, j in judged.items() if k != "local"):
        if hc.mode == RunMode.RUN:
            sys.exit(3)
        return None
    if summary["final_e_max_mean"] is None:
        return summary["final_nrmse_1step_max"]
    return summary["final_e_max_mean"]


#: Hydra's entry point: parses the command line, composes, runs one job or a sweep of them
task = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(run_task)


class _Callbacks:
    """The callbacks of ``hydra.callbacks``, called as Hydra's entry point calls them: in
    their order at a start, in reverse at an end; an exception of one is a warning."""

    def __init__(self, cfg: DictConfig) -> None:
        from hydra.utils import instantiate

        self.callbacks = [instantiate(c) for c in (cfg.hydra.get("callbacks") or {}).values()]

    def _notify(self, name: str, reverse: bool = False, **kwargs) -> None:
        import warnings

        for c in reversed(self.callbacks) if reverse else self.callbacks:
            try:
                getattr(c, name)(**kwargs)
            except Exception as e:
                warnings.warn(f"Callback {type(c).__name__}.{name} raised {type(e).__name__}: "
                              f"{e}", stacklevel=2)

    def on_run_start(self, config, **kwargs) -> None:
        self._notify("on_run_start", config=config, **kwargs)

    def on_run_end(self, config, **kwargs) -> None:
        self._notify("on_run_end", reverse=True, config=config, **kwargs)

    def on_job_start(self, config, **kwargs) -> None:
        self._notify("on_job_start", config=config, **kwargs)

    def on_job_end(self, config, **kwargs) -> None:
        self._notify("on_job_end", reverse=True, config=config, **kwargs)


def _checked(argv: list[str], hydra_on: contextlib.ExitStack) -> DictConfig | None:
    """The pre-run check of ``argv``. For a single run, its config (the check's composition,
    with Hydra's node), Hydra left initialized on the command's config folder until
    ``hydra_on`` closes; None for a sweep (``-m`` or ``hydra.mode=MULTIRUN``) and for
    ``--experimental-rerun``, which Hydra's entry point runs (:data:`task`)."""
    from hydra import initialize_config_dir
    from hydra.types import RunMode

    global _EXISTED
    config_dir = config_folder(argv)
    # the job's name as Hydra's entry point names the task of this module (hydra.job.name)
    hydra_on.enter_context(initialize_config_dir(config_dir=str(config_dir), version_base="1.3",
                                                 job_name=Path(__file__).stem))
    with HYDRA_LOCK:
        _EXISTED, cfg = check(argv, config_dir)
    if is_multirun(argv) or cfg.hydra.mode == RunMode.MULTIRUN or \
            flag_value(argv, "--experimental-rerun") is not None:
        hydra_on.close()
        return None
    return cfg


def run_once(cfg: DictConfig) -> float | None:
    """Run the single run of ``cfg`` (composed by the check, with Hydra's node) as Hydra's
    entry point runs one (``Hydra.run``) without composing it again: Hydra's logging, the
    callbacks, the job in ``hydra.run.dir`` (:func:`hydra.core.utils.run_job`: the folder,
    ``.hydra/``, the job's logging, ``hydra.job.chdir``, ``hydra.job.env_set``). Returns the
    job's value; raises what the job raised."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode

    if cfg.hydra.mode is None:      # as Hydra's entry point records a run of no given mode
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    config_name = cfg.hydra.job.config_name
    callbacks = _Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(task_function=run_task, config=cfg, job_dir_key="hydra.run.dir",
                  job_subdir_key=None, configure_logging=True,
                  hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                                             callbacks=callbacks))
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    return ret.return_value


#: ``fnsysid show --help``
SHOW_USAGE = """usage: fnsysid show RUN_DIR

Print the status, held-out scores, the model check's verdict and the identified equations
of a finished run, or of each job of a sweep (RUN_DIR a sweep folder), from the files the
run wrote.

Exit status: 0 every run shown is ok; 3 one is not (diverged, growing, interrupted,
refused); 2 RUN_DIR is not a finished run or sweep. The model check's verdict (missing
terms, free run fails, ...) is a diagnosis beside the status: it does not change it."""


def show(args: list[str]) -> int:
    """``fnsysid show RUN_DIR``: print the status, scores and equations of a finished run (or
    of each job of a sweep). Exit code 0 when every run shown is ``ok``, 3 when one is not
    (diverged, growing, interrupted, refused), 2 for a folder that is not a run or a sweep."""
    from fnsysid.results.equations import show_text, statuses

    if args in (["--help"], ["-h"]):
        print(SHOW_USAGE)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print("fnsysid: error: usage: fnsysid show RUN_DIR (the folder of a finished run or "
              f"sweep); given: {' '.join(args) or 'nothing'}", file=sys.stderr)
        return 2
    try:
        lines = show_text(Path(args[0]))
    except ConfigError as exc:
        print(f"fnsysid: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if all(s == "ok" for s in statuses(Path(args[0]))) else 3


def lr_advice(summary: dict, lr: float) -> str:
    """The advice of a diverged or growing run: a smaller ``lr``; under a round-based privacy
    mechanism first the noise it adds to the model every round, which a smaller ``lr`` does
    not shrink (``privacy.round_noise_sd``: ``privacy.clip`` times the noise multiplier over
    the expected clients of a round, per coefficient)."""
    priv = summary.get("privacy") or {}
    sd = priv.get("round_noise_sd")
    if not sd:
        return f"try a smaller lr than {lr:g}"
    from fnsysid.learning.privacy import noise_formula

    return (f"privacy adds noise of std {sd:.3g} per coefficient to the model every round "
            f"(privacy.round_noise_sd: {noise_formula(priv.get('mode'))}, over the expected "
            "clients of a round), which a "
            "smaller lr does not shrink: a privacy.clip nearer the model changes' norms (K lr "
            "times a gradient), more clients or a larger privacy.epsilon; where that is not the "
            f"cause, a smaller lr than {lr:g}")


def divergence_line(summary: dict, lr: float) -> str:
    """The log line of a diverged run: the repeats and rounds that diverged, the rows kept
    (each repeat's up to the round before its own divergence), the advice."""
    from fnsysid.results.history import DIVERGENCE_FACTOR

    rule = f"an error not finite or above {DIVERGENCE_FACTOR:g} times its start"
    at = summary.get("repeat_diverged_round") or []
    gone = [(s, d) for s, d in enumerate(at) if d is not None]
    advice = lr_advice(summary, lr)
    if len(at) <= 1 or not gone:            # one repeat, or a runtime that stops at the first
        return (f"run diverged at round {summary['diverged_round']} ({rule}): results up to "
                f"round {summary['rounds_completed']} kept; {advice}")
    where = ", ".join(f"repeat {s} at round {d}" for s, d in gone[:10]) + \
        (", ..." if len(gone) > 10 else "")
    if len(gone) < len(at):
        return (f"{len(gone)} of {len(at)} repeats diverged ({where}; {rule}): their rows are "
                "empty from that round on, the other repeats' rows are kept up to round "
                f"{summary['rounds_completed']}; {advice}")
    return (f"run diverged in every repeat ({where}; {rule}): each repeat's rows are kept up "
            f"to the round before its own; {advice}")


def main() -> None:
    """Console entry point (``fnsysid`` or ``python run.py``)."""
    # Every array operation of a run is small or memory-bound: BLAS threads would only compete
    # with the other jobs of a sweep for the cores. One thread per process unless the
    # environment says otherwise; numpy is not imported yet, so this takes effect.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if sys.argv[1:2] in (["compare"], ["show"]):  # no Hydra job: a printed report
        from fnsysid.app.compare import main as compare

        report = compare if sys.argv[1] == "compare" else show
        try:
            code = report(sys.argv[2:])
            sys.stdout.flush()
        except BrokenPipeError:           # `fnsysid show RUN | head`: the reader stopped
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = 0
        sys.exit(code)
    if "--version" in sys.argv[1:]:     # fnsysid's version (Hydra's own flag would print its)
        from fnsysid import __version__

        print(f"fnsysid {__version__}")
        sys.exit(0)
    argv = sys.argv[1:] = absolute_config_path(flags_first(sys.argv[1:]))
    logging.raiseExceptions = False     # a full disk must not print logging tracebacks
    if not CONF_DIR.is_dir():
        print(f"fnsysid: error: config folder {CONF_DIR} not found; install from a checkout "
              "with `make install` (editable), which keeps conf/ beside the package",
              file=sys.stderr)
        sys.exit(2)
    interrupt.parent_handlers()
    try:
        with contextlib.ExitStack() as hydra_on:
            cfg = None
            try:
                check_commands(argv)
                if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c",
                                 "--shell-completion", "-sc") for a in argv):
                    cfg = _checked(argv, hydra_on)
            except ConfigError as exc:
                print(f"fnsysid: error: {exc}", file=sys.stderr)
                sys.exit(2)
            if cfg is None:
                task()              # Hydra's entry point: a sweep, --help, --cfg, ...
            else:
                run_once(cfg)       # the single run, composed once (by the check)
    except (interrupt.Interrupted, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"fnsysid: interrupted by {signal.Signals(signum).name}: stopped; a job folder "
              "without summary.json is incomplete (a sweep can be resumed with "
              "output.resume=true)", file=sys.stderr)
        sys.exit(interrupt.exit_code(signum))
    finally:
        release()           # the results folder's lock, however the run ended
    sweep_exit()
