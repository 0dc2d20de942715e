"""Run one experiment on a local Flower deployment and compare it with the in-process run.

On 127.0.0.1 only: one SuperLink, one SuperNode per client (each with the path of its own
trajectory file in its node config), and ``flwr run deploy/flower`` submitting the run. The
same files are then run in process; the per-round errors must agree to 1e-10.

    python scripts/flower_deploy.py [--out DIR] [--clients 3] [run.py overrides ...]
    make flower-deploy ARGS="strategy=scaffold R=10"
    python scripts/flower_deploy.py --compare RUN_A RUN_B

``--compare`` only compares two finished runs (a manual deployment's ``outdir`` and the same
settings run in process, docs/FEDERATED.md): it prints the largest difference of their
per-round errors and held-out NRMSE and of their estimates, and exits 1 above 1e-10.

With ``--netns`` (root): every machine on a host of its own (a network namespace with its
own address), TLS and node authentication, a rogue device refused, a SuperNode killed and
restarted (docs/FEDERATED.md, docs/SECURITY.md, ``scripts/flower_netns.py``).

Steps: (1) simulate M clients and write each client's trajectories to ``DIR/data/<i>.parquet``
and its true parameters to ``DIR/truth/<i>.csv`` (all clients': ``DIR/truth.csv``); (2) the
in-process run on those files into ``DIR/inprocess``; (3) the deployment
(``FLWR_HOME=DIR/flwr-home``) writing ``DIR/flower``;
(4) the comparison. Needs the ``flower`` extra. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
#: the lines of the ServerApp's log shown while a deployment runs (one per round, results)
PROGRESS = re.compile(r"(round \d+ of \d+ done.*|results: .*)$")
#: the experiment when no overrides are given: small and quick
DEFAULT = ["system=synthetic", "R=5", "repeats=2", "eps=0.2", "strategy=fedavg"]


def free_ports(n: int) -> list[int]:
    """``n`` free TCP ports on the loopback address."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((HOST, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_data(out: Path, M: int, overrides: list[str]) -> list[str]:
    """Simulate M clients; one trajectory file per client and the truth. Returns overrides
    that read them (the same for both runtimes)."""
    import fnsysid
    from fnsysid.config.checks import FILE_KNOBS, override_key

    sim = out / "simulated"
    fnsysid.run([*overrides, f"M={M}", "output.trajectories=true", "output.plot=false"], sim)
    traj = pd.read_parquet(sim / "trajectories.parquet")
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    truth = pd.read_csv(sim / "truth.csv")
    (out / "truth").mkdir(exist_ok=True)
    for client, part in traj.groupby("client"):
        part.to_parquet(data / f"{client}.parquet", index=False)
        truth[truth["client"] == client].to_csv(out / "truth" / f"{client}.csv", index=False,
                                                float_format="%.17g")
    truth.to_csv(out / "truth.csv", index=False, float_format="%.17g")
    # N, T, eps and the data.* settings of the simulation shaped the files; a run reading them
    # refuses them (it gets data.* of its own below)
    reading = [o for o in overrides if override_key(o) not in FILE_KNOBS
               and not override_key(o).startswith("data.")]
    return [*reading, f"M={M}", "data=files", f"data.path={data}",
            f"data.truth={out / 'truth.csv'}", "data.holdout=0"]


def stop_processes(procs) -> None:
    """End the processes ``procs``: SIGTERM to those still running, then SIGKILL to any that
    has not ended 20 s later, each reaped."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Federation:
    """A SuperLink and SuperNodes on the loopback address, stopped on exit."""

    def __init__(self, home: Path, data_files: list[Path], truth: Path, log_dir: Path,
                 certs: Path | None = None):
        self.home, self.truth, self.log_dir = home, truth, log_dir
        #: with TLS and node authentication: the folder of scripts/flower_certs.py's files
        self.certs = certs
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []
        self.link_port, *self.node_ports = free_ports(1 + len(data_files))
        self.env = {**os.environ, "FLWR_HOME": str(home),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "fnsysid-local"\n\n'
            f'[superlink.fnsysid-local]\naddress = "{HOST}:{self.link_port}"\n'
            + ("insecure = true\n" if certs is None else
               f'root-certificates = "{certs / "ca.crt"}"\n'))
        self.data_files = data_files
        #: what ``flwr run`` is run under (a network namespace with ``--netns``)
        self.prefix: list[str] = []

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, cwd=self.log_dir))
        self.names.append(name)

    def stopped(self) -> list[str]:
        """The processes that ended on their own: ``name (file, exit code)``."""
        out = []
        for i, (name, proc) in enumerate(zip(self.names, self.procs, strict=True)):
            if proc.poll() is not None:
                what = f", {self.data_files[i - 1].name}" if i else ""
                out.append(f"{name} ({self.log_dir / name}.log{what}, exit {proc.returncode})")
        return out

    def __enter__(self):
        c = self.certs
        tls = ["--insecure"] if c is None else [
            "--ssl-ca-certfile", str(c / "ca.crt"), "--ssl-certfile", str(c / "server.pem"),
            "--ssl-keyfile", str(c / "server.key"), "--enable-supernode-auth"]
        self._start("superlink", [str(BIN / "flower-superlink"), *tls, "--host", HOST,
                                  "--port", str(self.link_port),
                                  "--disable-runtime-dependency-installation"])
        wait_for_port(self.link_port, self.procs[0])
        for i, (path, port) in enumerate(zip(self.data_files, self.node_ports, strict=True)):
            if c is not None:           # only registered SuperNodes may connect
                subprocess.run([str(BIN / "flwr"), "supernode", "register",
                                str(c / f"node{i}.pub"), "fnsysid-local"], env=self.env,
                               check=True, capture_output=True, cwd=self.log_dir, timeout=120)
            self._start(f"supernode{i}", [
                str(BIN / "flower-supernode"),
                *(["--insecure"] if c is None else [
                    "--root-certificates", str(c / "ca.crt"),
                    "--auth-supernode-private-key", str(c / f"node{i}")]),
                "--superlink", f"{HOST}:{self.link_port}", "--host", HOST, "--port", str(port),
                "--node-config", f"data-path='{path}' "
                                 f"truth-path='{self.truth / path.stem}.csv'"])
        return self

    def run(self, overrides: list[str], outdir: Path, timeout: float, log: Path,
            show=print) -> int:
        """``flwr run deploy/flower`` with the experiment's overrides; waits for the end and
        returns its exit status. Everything it prints goes to ``log``; the ServerApp's
        progress lines (:data:`PROGRESS`: one per round, the results) are also passed to
        ``show`` as they arrive."""
        run_config = f"overrides='{' '.join(overrides)}' outdir='{outdir}'"
        proc = subprocess.Popen([*self.prefix, str(BIN / "flwr"), "run",
                                 str(ROOT / "deploy" / "flower"),
                                 "fnsysid-local", "--stream", "--run-config", run_config],
                                env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=self.log_dir)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        self.round_times = []
        try:
            with open(log, "w") as out:
                for line in proc.stdout:
                    out.write(line)
                    out.flush()
                    if PROGRESS.search(line):
                        show(f"  {PROGRESS.search(line).group(0).strip()}", flush=True)
                        if "done" in line:
                            self.round_times.append(time.perf_counter())
            return proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def __exit__(self, *exc):
        stop_processes(self.procs)
        # the SuperLink and SuperNodes start helper processes in sessions of their own, which
        # name their parent's pid or our ports on their command lines
        marks = [f"{HOST}:{p}" for p in (self.link_port, *self.node_ports)]
        marks += [f"--parent-pid {p.pid}" for p in self.procs]
        for proc in leftover(marks):
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until ``proc`` listens on ``port`` (loopback)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the SuperLink stopped (exit {proc.returncode}); see its log")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"nothing listens on {HOST}:{port} after {timeout:g} s")


def leftover(marks: list[str]) -> list[psutil.Process]:
    """Flower processes whose command line contains one of ``marks``."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if ("flower-" in cmd or "flwr-" in cmd) and any(m in cmd for m in marks):
            out.append(proc)
    return out


#: the columns of errors.csv compared: parameter errors and the held-out NRMSE (federated
#: evaluation)
COMPARED = ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max",
            "nrmse_sim_mean")


def compare(a: Path, b: Path) -> float:
    """Largest difference of the per-round errors and held-out NRMSE of two runs (inf where
    one run has a value the other lacks)."""
    ea, eb = pd.read_csv(a / "errors.csv"), pd.read_csv(b / "errors.csv")
    if len(ea) != len(eb):
        raise SystemExit(f"the runs have {len(ea)} and {len(eb)} rows in errors.csv")
    diff = 0.0
    for c in COMPARED:
        x, y = ea[c].to_numpy(float), eb[c].to_numpy(float)
        if (np.isnan(x) != np.isnan(y)).any():
            return float("inf")
        both = ~np.isnan(x)
        if both.any():
            diff = max(diff, float(np.abs(x[both] - y[both]).max()))
    return diff


def compare_runs(a: Path, b: Path) -> dict:
    """``--compare``: :func:`compare` of two run folders and the largest difference of their
    estimates (rows matched by repeat, client and parameter); prints both, exits 1 above
    1e-10."""
    for run in (a, b):
        if not (run / "errors.csv").is_file():
            raise SystemExit(f"flower_deploy: {run} is not a run folder (no errors.csv)")
    with np.errstate(invalid="ignore"):             # inf - inf: the same blown-up free run
        errors = compare(a, b)
    have = [(r / "estimates.csv").is_file() for r in (a, b)]
    if not any(have):                   # neither ended ok: no estimates to compare
        est = 0.0
    elif not all(have):
        est = float("inf")
    else:
        keys = ["repeat", "client", "parameter"]
        ea, eb = (pd.read_csv(r / "estimates.csv", dtype={"client": str}) for r in (a, b))
        both = ea[keys + ["estimate"]].merge(eb[keys + ["estimate"]], on=keys, how="outer")
        est = float(np.abs(both["estimate_x"] - both["estimate_y"]).max()) \
            if not both[["estimate_x", "estimate_y"]].isna().any().any() else float("inf")
    print(f"max |difference| of the errors and held-out NRMSE per round: {errors:.2e}; of "
          f"the estimates: {est:.2e}")
    if not max(errors, est) <= 1e-10:
        raise SystemExit(f"the runs {a} and {b} differ by more than 1e-10")
    return {"max_abs_diff": errors, "max_abs_diff_estimates": est}


def _script(name: str):
    """The module of ``scripts/<name>.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NetnsFederation(Federation):
    """The SuperLink (with nginx serving its Fleet API alone on the host's address) and each
    SuperNode in a network namespace of its own (``nets``: scripts/flower_netns.py), over
    TLS with node authentication; the operator's ``flwr`` runs on the SuperLink's host and
    reaches it on that host's loopback address."""

    def __init__(self, home: Path, data_files: list[Path], truth: Path, log_dir: Path,
                 certs: Path, nets):
        super().__init__(home, data_files, truth, log_dir, certs)
        self.nets, self.netns = nets, _script("flower_netns")
        self.link_addr = nets.addr["superlink"]
        self.by_name: dict[str, subprocess.Popen] = {}
        self.prefix = nets.cmd("superlink", [])
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "fnsysid-local"\n\n'
            f'[superlink.fnsysid-local]\naddress = "127.0.0.1:{self.netns.LINK_PORT}"\n'
            f'root-certificates = "{certs / "ca.crt"}"\n')

    def _start(self, name: str, args: list[str]) -> None:
        where = "superlink" if name in ("superlink", "nginx") else f"node{name[9:]}"
        super()._start(name, self.nets.cmd(where, args))
        self.by_name[name] = self.procs[-1]

    def stopped(self) -> list[str]:
        """The SuperLink, nginx or SuperNodes that ended on their own."""
        return [f"{name} ({self.log_dir / name}.log, exit {proc.returncode})"
                for name, proc in self.by_name.items() if proc.poll() is not None]

    def start_node(self, i: int) -> None:
        """Start SuperNode ``i`` on its host (again: the log of the one before is kept as
        ``supernode<i>.killed.log``)."""
        c, path = self.certs, self.data_files[i]
        log = self.log_dir / f"supernode{i}.log"
        if f"supernode{i}" in self.by_name and log.exists():
            log.replace(self.log_dir / f"supernode{i}.killed.log")
        self._start(f"supernode{i}", [
            str(BIN / "flower-supernode"), "--root-certificates", str(c / "ca.crt"),
            "--auth-supernode-private-key", str(c / f"node{i}"),
            "--superlink", f"{self.link_addr}:{self.netns.FLEET_PORT}",
            "--node-config", f"data-path='{path}' truth-path='{self.truth / path.stem}.csv'"])

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and every process of its host (its ClientApps)."""
        self.nets.kill(f"node{i}")
        self.by_name[f"supernode{i}"].wait()

    def __enter__(self):
        c, netns = self.certs, self.netns
        self._start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(c / "ca.crt"),
            "--ssl-certfile", str(c / "server.pem"), "--ssl-keyfile", str(c / "server.key"),
            "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(netns.LINK_PORT),
            "--disable-runtime-dependency-installation"])
        netns.wait_listening(self.nets, "superlink", "127.0.0.1", netns.LINK_PORT,
                             self.procs[-1])
        conf = netns.nginx_conf(self.log_dir / "nginx", c,
                                f"{self.link_addr}:{netns.FLEET_PORT}")
        self._start("nginx", ["nginx", "-c", str(conf), "-e",
                              str(self.log_dir / "nginx" / "nginx-error.log")])
        netns.wait_listening(self.nets, "superlink", self.link_addr, netns.FLEET_PORT,
                             self.procs[-1])
        for i in range(len(self.data_files)):
            # the operator registers each SuperNode's key on the SuperLink's host
            subprocess.run([*self.prefix, str(BIN / "flwr"), "supernode", "register",
                            str(c / f"node{i}.pub"), "fnsysid-local"], env=self.env,
                           check=True, capture_output=True, cwd=self.log_dir, timeout=120)
            self.start_node(i)
        return self

    def __exit__(self, *exc):
        stop_processes(self.procs)


def rogue_tries(nets, certs: Path, out: Path, env: dict) -> dict:
    """What a device of the devices' network that holds ``ca.crt`` and a key of its own gets
    from the SuperLink's host, on the Fleet port (nginx) and on the SuperLink's own port:
    whether it reaches each port, and the exit status and last line of ``flwr supernode
    register`` and ``flwr run``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    netns = _script("flower_netns")
    home = out / "rogue-home"
    home.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    (home / "rogue.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    fd = os.open(home / "rogue", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption()))
    addr = nets.addr["superlink"]
    ports = {"fleet": netns.FLEET_PORT, "link": netns.LINK_PORT}
    (home / "config.toml").write_text("[superlink]\ndefault = \"fleet\"\n\n" + "".join(
        f'[superlink.{name}]\naddress = "{addr}:{port}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n\n' for name, port in ports.items()))
    renv = {**env, "FLWR_HOME": str(home)}
    report = {}
    for name, port in ports.items():
        probe = f"import socket; socket.create_connection(('{addr}', {port}), 5).close()"
        reach = subprocess.run(nets.cmd("rogue", [sys.executable, "-c", probe]),
                               capture_output=True, timeout=60).returncode == 0
        tries = {"reaches": reach}
        for what, cmd in (
                ("register", ["supernode", "register", str(home / "rogue.pub"), name]),
                ("run", ["run", str(ROOT / "deploy" / "flower"), name, "--run-config",
                         f"overrides='system=synthetic M=3' outdir='{out / 'rogue-run'}'"])):
            try:
                res = subprocess.run(nets.cmd("rogue", [str(BIN / "flwr"), *cmd]), env=renv,
                                     capture_output=True, text=True, timeout=120, cwd=home)
                # flwr frames its messages in boxes: their words on one line
                words = [" ".join(line.strip(" │╭╮╰╯─").split())
                         for line in (res.stdout + res.stderr).splitlines()]
                words = [w for w in words if any(ch.isalpha() for ch in w) and not w.startswith(
                    ("Using SuperLink", "For more information", "https://developer"))]
                tries[what] = (res.returncode, " ".join(words)[-300:])
            except subprocess.TimeoutExpired:
                tries[what] = (None, "no answer within 120 s")
        report[f"{name} port {port}"] = tries
    # a SuperNode with the rogue's own (unregistered) key on the Fleet port
    try:
        res = subprocess.run(nets.cmd("rogue", [
            str(BIN / "flower-supernode"), "--root-certificates", str(certs / "ca.crt"),
            "--auth-supernode-private-key", str(home / "rogue"),
            "--superlink", f"{addr}:{netns.FLEET_PORT}", "--port", "9094",
            "--max-retries", "2", "--max-wait-time", "60"]), env=renv, capture_output=True,
            text=True, timeout=90, cwd=home)
        lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
        report["supernode"] = (res.returncode, lines[-1].strip()[-300:] if lines else "")
    except subprocess.TimeoutExpired:
        # Flower 1.42's SuperNode keeps waiting after the SuperLink refuses its key (412 on
        # /v1/fleet/activate-node in nginx's log); whether it came online is what counts
        report["supernode"] = (None, "not online after 90 s (stopped)")
    return report


def admitted(tries: tuple) -> bool:
    """Whether a rogue's ``flwr`` command succeeded."""
    return tries[0] == 0


def flower_summary(out: Path, code, stopped: list[str]) -> tuple[dict, str]:
    """The Flower run's ``summary.json`` in ``out/flower`` and the words naming the nodes that
    stopped during it; exits with one line when the run wrote no results."""
    died = f"; stopped during the run: {', '.join(stopped)}" if stopped else ""
    if not (out / "flower" / "summary.json").exists():
        raise SystemExit(f"flwr run wrote no results (exit {code}){died}; see "
                         f"{out}/flwr-run.log and {out}/supernode*.log")
    return json.loads((out / "flower" / "summary.json").read_text()), died


def main_netns(out: Path, files: list[Path], overrides: list[str], on_flower: list[str],
               timeout: float, t_inprocess: float) -> dict:
    """The deployment across network namespaces: the rogue device's tries, a run in which
    SuperNode 1 is killed after round 1, its restart, and the full run compared with the
    in-process one."""
    netns = _script("flower_netns")
    certs = out / "certs"
    names = ["superlink", *(f"node{i}" for i in range(len(files))), "rogue"]
    with netns.Namespaces(names) as nets:
        _script("flower_certs").make(certs, [nets.addr["superlink"], "127.0.0.1"], len(files))
        print(f"network namespaces {nets.tag}-*: SuperLink {nets.addr['superlink']} (Fleet "
              f"API via nginx on :{netns.FLEET_PORT}; all APIs on 127.0.0.1:"
              f"{netns.LINK_PORT} of its host only), SuperNodes "
              + ", ".join(nets.addr[f"node{i}"] for i in range(len(files)))
              + f", a rogue device {nets.addr['rogue']}", flush=True)
        t0 = time.perf_counter()
        with NetnsFederation(out / "flwr-home", files, out / "truth", out, certs,
                             nets) as fed:
            rogue = rogue_tries(nets, certs, out, fed.env)
            print("rogue device -> a SuperNode with its own key: exit "
                  f"{rogue['supernode'][0]}: {rogue['supernode'][1][:200]}", flush=True)
            for where, tries in rogue.items():
                if where == "supernode":
                    continue
                print(f"rogue device -> {where}: "
                      f"{'reached' if tries['reaches'] else 'unreachable'}; "
                      + "; ".join(f"flwr {w} {'ADMITTED' if admitted(tries[w]) else 'refused'}"
                                  f" (exit {tries[w][0]}: {tries[w][1][:120]})"
                                  for w in ("register", "run")), flush=True)
            listed = subprocess.run([*fed.prefix, str(BIN / "flwr"), "supernode", "list",
                                     "fnsysid-local", "--format", "json"], env=fed.env,
                                    capture_output=True, text=True, timeout=120, cwd=out)
            (out / "supernodes.json").write_text(listed.stdout)
            try:
                nodes = json.loads(listed.stdout).get("nodes")
            except (ValueError, AttributeError):
                nodes = None
            victim, killed = 1 % len(files), {}

            def show(line: str, flush: bool = True) -> None:
                print(line, flush=flush)
                if not killed and re.search(r"round 1 of \d+ done", line):
                    fed.kill_node(victim)
                    killed["round"] = 1
                    print(f"  killed supernode{victim} (client {files[victim].stem}, host "
                          f"{nets.addr[f'node{victim}']}) after round 1", flush=True)

            fed.run([*overrides, *on_flower], out / "flower-killed", timeout,
                    out / "flwr-run-killed.log", show=show)
            first = out / "flower-killed" / "summary.json"
            first = json.loads(first.read_text()) if first.exists() else {}
            stop = (f"the run stopped: {first.get('error')} (rounds 0 to "
                    f"{first.get('rounds_completed')} written to {out / 'flower-killed'}, "
                    f"status {first.get('status')}; every strategy averages over all the "
                    "clients it was given)") if first.get("status") == "interrupted" else \
                f"the run ended with status {first.get('status')} (not stopped by the node)"
            print(f"supernode{victim} killed after round {killed.get('round')}: {stop}",
                  flush=True)
            fed.start_node(victim)
            print(f"supernode{victim} restarted; the full run:", flush=True)
            code = fed.run([*overrides, *on_flower], out / "flower", timeout,
                           out / "flwr-run.log")
            stopped = fed.stopped()
            ticks = np.diff(fed.round_times)
        t_flower = time.perf_counter() - t0
    summary, died = flower_summary(out, code, stopped)
    diff = compare(out / "inprocess", out / "flower") if summary["status"] == "ok" \
        else float("inf")
    refused = all(not admitted(t[w]) for k, t in rogue.items() if k != "supernode"
                  for w in ("register", "run"))
    report = {"clients": len(files), "overrides": overrides, "runtime": summary["runtime"],
              "tls": True, "netns": True, "addresses": nets.addr,
              "rogue": rogue, "rogue_refused": refused,
              "registered_nodes": None if nodes is None else len(nodes),
              "killed": {"supernode": victim, "client": files[victim].stem,
                         "after_round": killed.get("round"), "status": first.get("status"),
                         "error": first.get("error"),
                         "rounds_completed": first.get("rounds_completed")},
              "final_e_max_mean": summary["final_e_max_mean"], "max_abs_diff": diff,
              "deployment_s": round(t_flower, 1), "inprocess_s": round(t_inprocess, 2),
              "s_per_round": round(float(ticks.mean()), 1) if len(ticks) else None}
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"max |difference| to in process: {diff:.2e}")
    if summary["status"] != "ok":
        raise SystemExit(f"the deployment stopped: {summary.get('error', summary['status'])}"
                         f"{died}")
    if not refused:
        raise SystemExit("a rogue device was admitted (see the lines above)")
    if nodes is None or len(nodes) != len(files):
        raise SystemExit(f"flwr supernode list on the SuperLink's host gave "
                         f"{'no list' if nodes is None else len(nodes)} SuperNodes, not the "
                         f"{len(files)} the operator registered ({out / 'supernodes.json'})")
    if first.get("status") != "interrupted":
        raise SystemExit(f"the run with supernode{victim} killed ended with status "
                         f"{first.get('status')}, not interrupted")
    if not diff <= 1e-10:
        raise SystemExit("the deployment and the in-process run differ by more than 1e-10")
    return report


def deploy_folder(given: str | None) -> Path:
    """The results folder of one call, made here: ``given`` if it is new or empty (else one
    line, exit 2: the runs inside would refuse an earlier run's folder halfway), or a new
    ``outputs/flower-deploy/<date>_<time>`` (a suffix ``-1``, ``-2``, ... within a second)."""
    if given is not None:
        out = Path(given).resolve()
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            print(f"flower_deploy: error: --out {given} is not an empty folder; allowed: a new "
                  "or empty folder (default: a new outputs/flower-deploy/<date>_<time>)",
                  file=sys.stderr)
            raise SystemExit(2)
        out.mkdir(parents=True, exist_ok=True)
        return out
    base = Path("outputs/flower-deploy").resolve() / time.strftime("%Y-%m-%d_%H-%M-%S")
    for k in range(1000):
        out = base.with_name(base.name + (f"-{k}" if k else ""))
        try:
            out.mkdir(parents=True)
            return out
        except FileExistsError:
            continue
    raise SystemExit(f"flower_deploy: error: no new folder next to {base}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="results folder, new or empty (default: a new "
                         "outputs/flower-deploy/<date>_<time> at each call)")
    ap.add_argument("--clients", type=int, default=3, help="SuperNodes (one client each)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for the flwr run")
    ap.add_argument("--tls", action="store_true",
                    help="TLS and node authentication: certificates and SuperNode keys made "
                         "by scripts/flower_certs.py into DIR/certs, each SuperNode "
                         "registered with flwr supernode register")
    ap.add_argument("--netns", action="store_true",
                    help="many hosts: the SuperLink, each SuperNode and a rogue device in "
                         "network namespaces of their own (root only; TLS and node "
                         "authentication; a SuperNode killed and restarted; "
                         "scripts/flower_netns.py)")
    ap.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                    help="only compare two finished runs (no deployment): the largest "
                         "difference of their errors.csv and estimates.csv; exit 1 above "
                         "1e-10")
    ap.add_argument("overrides", nargs="*", help="run.py overrides (default: a small run)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare_runs(*map(Path, args.compare))
    if args.netns:
        _script("flower_netns").refuse_unless_root()
    from fnsysid.runtimes.check import INSTALL_FLOWER, flower_installed

    if not flower_installed():
        raise SystemExit(f"flower_deploy: Flower is not installed: {INSTALL_FLOWER}")
    out = deploy_folder(args.out)
    from fnsysid.config.checks import override_key

    given = args.overrides or DEFAULT
    # runtime=flower runtime.reply_timeout=...: for the deployment only (the simulation and
    # the in-process run are in process)
    on_flower = [o for o in given if override_key(o).split(".")[0] == "runtime"]
    overrides = make_data(out, args.clients, [o for o in given if o not in on_flower])

    import fnsysid

    t0 = time.perf_counter()
    fnsysid.run([*overrides, "output.plot=false"], out / "inprocess")
    t_inprocess = time.perf_counter() - t0

    files = sorted((out / "data").glob("*.parquet"))
    if args.netns:
        return main_netns(out, files, overrides, on_flower, args.timeout, t_inprocess)
    t0 = time.perf_counter()
    print(f"deployment on {HOST}: a SuperLink and {len(files)} SuperNodes, then flwr run "
          f"(log: {out / 'flwr-run.log'})", flush=True)
    certs = None
    if args.tls:
        certs = out / "certs"
        _script("flower_certs").make(certs, [HOST], len(files))
    with Federation(out / "flwr-home", files, out / "truth", out, certs) as fed:
        code = fed.run([*overrides, *on_flower], out / "flower", args.timeout,
                       out / "flwr-run.log")
        stopped = fed.stopped()
        ticks = np.diff(fed.round_times)
    t_flower = time.perf_counter() - t0
    summary, died = flower_summary(out, code, stopped)
    if summary["status"] != "ok":
        raise SystemExit(f"the deployment stopped: {summary.get('error', summary['status'])}"
                         f"{died}; rounds 0 to {summary['rounds_completed']} written to "
                         f"{out / 'flower'} (status: {summary['status']}); see "
                         f"{out}/flwr-run.log")
    diff = compare(out / "inprocess", out / "flower")
    report = {"clients": len(files), "overrides": overrides, "runtime": summary["runtime"],
              "tls": certs is not None,
              "final_e_max_mean": summary["final_e_max_mean"], "max_abs_diff": diff,
              "deployment_s": round(t_flower, 1), "inprocess_s": round(t_inprocess, 2),
              "s_per_round": round(float(ticks.mean()), 1) if len(ticks) else None}
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"deployment on {HOST} with {len(files)} SuperNodes"
          f"{' (TLS, node authentication)' if certs is not None else ''}: {t_flower:.1f} s "
          f"(in process {t_inprocess:.2f} s; {report['s_per_round']} s per round); final "
          f"e_max {summary['final_e_max_mean']:.6f}; max |difference| of the errors and "
          f"held-out NRMSE per round vs in process: {diff:.2e}")
    if not diff <= 1e-10:
        raise SystemExit("the deployment and the in-process run differ by more than 1e-10")
    return report


if __name__ == "__main__":
    main()
