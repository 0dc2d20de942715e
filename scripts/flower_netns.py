"""The deployment of ``scripts/flower_deploy.py --netns``: one host per network namespace.

Each of the SuperLink, the SuperNodes and a rogue device (which holds ``ca.crt`` and a key of
its own) runs in a network namespace of its own with its own address on a private bridge
(``10.213.0.0/24``; the bridge lives in one more namespace). The namespaces have no route
out: nothing they run can reach an address outside this machine. All of them, their veth
pairs and every process in them are removed at the end, also after an error, Ctrl-C or
SIGTERM. Root only (``ip netns``).

Who reaches what (docs/SECURITY.md): in Flower 1.42 one HTTPS port of the SuperLink serves
its Fleet API (SuperNodes), Control API (``flwr run``, ``flwr supernode register``) and
Runtime API (the ServerApp). The SuperLink therefore listens on the loopback address of its
own host only (``--host 127.0.0.1``), where the operator runs ``flwr``; the devices reach the
Fleet API alone through nginx on the host's network address, which serves ``/v1/fleet/`` and
refuses every other path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: the private network inside the namespaces (never routed anywhere)
NET = "10.213.0"
#: the SuperLink's port on its loopback address (all of Flower's APIs) and nginx's port on
#: the SuperLink host's network address (the Fleet API only)
LINK_PORT, FLEET_PORT = 9093, 9092


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def refuse_unless_root() -> None:
    """One line and exit status 2 unless this process may create network namespaces."""
    if os.geteuid() != 0:
        raise SystemExit("flower_deploy: --netns needs root (it creates network namespaces "
                         "with ip netns); run it as root, or without --netns")
    for tool in ("ip", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"flower_deploy: --netns needs {tool} on PATH (apt-get install "
                             f"{'iproute2' if tool == 'ip' else 'nginx-light'})")


class Namespaces:
    """Network namespaces ``names`` joined by a bridge; ``addr[name]`` is each one's address.
    Removed (with every process in them) on exit and on SIGTERM."""

    def __init__(self, names: list[str]):
        self.tag = f"fnsysid{os.getpid()}"
        self.names = list(names)
        self.addr = {n: f"{NET}.{i + 1}" for i, n in enumerate(self.names)}
        self.made: list[str] = []
        self._term = None

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def cmd(self, name: str, args: list[str]) -> list[str]:
        """``args`` run in namespace ``name``."""
        return ["ip", "netns", "exec", self.ns(name), *args]

    def __enter__(self):
        self._term = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            bridge = self.ns("bridge")
            ip("netns", "add", bridge)
            self.made.append(bridge)
            ip("-n", bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", bridge, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns = self.ns(name)
                ip("netns", "add", ns)
                self.made.append(ns)
                ip("-n", bridge, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                   "netns", ns)
                ip("-n", bridge, "link", "set", f"v{i}", "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process in namespace ``name``; returns their ids."""
        out = subprocess.run(["ip", "netns", "pids", self.ns(name)], capture_output=True,
                             text=True, timeout=30)
        pids = [int(p) for p in out.stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def remove(self) -> None:
        """Every process in the namespaces killed, then the namespaces (and with them their
        veth pairs and the bridge) deleted."""
        for ns in reversed(self.made):
            name = ns[len(self.tag) + 1:]
            for _ in range(20):
                if not self.kill(name):
                    break
                time.sleep(0.1)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made.clear()

    def __exit__(self, *exc):
        self.remove()
        if self._term is not None:
            signal.signal(signal.SIGTERM, self._term)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def left_over(prefix: str = "fnsysid") -> list[str]:
    """Namespaces named ``prefix...`` that exist (for the tests)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines()
            if line.startswith(prefix)]


def wait_listening(nets: Namespaces, name: str, host: str, port: int, proc,
                   timeout: float = 120.0) -> None:
    """Wait until something in namespace ``name`` accepts connections on ``host:port``."""
    probe = (f"import socket; socket.create_connection(('{host}', {port}), 2).close()")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"flower_deploy: the {name} process stopped (exit "
                             f"{proc.returncode}) before listening on {host}:{port}; see its "
                             "log")
        if subprocess.run(nets.cmd(name, [sys.executable, "-c", probe]),
                          capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(f"flower_deploy: nothing listens on {host}:{port} in {name} after "
                     f"{timeout:g} s")


def nginx_conf(folder: Path, certs: Path, listen: str) -> Path:
    """nginx's config: TLS on ``listen`` with the SuperLink's certificate; ``/v1/fleet/``
    passed to the SuperLink on the loopback address, every other path answered 403."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    tmp = folder / "tmp"
    conf = folder / "nginx.conf"
    conf.write_text(f"""daemon off;
worker_processes 1;
pid {folder / 'nginx.pid'};
error_log {folder / 'nginx-error.log'} warn;
events {{ worker_connections 512; }}
http {{
  access_log {folder / 'nginx-access.log'};
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  client_max_body_size 0;
  underscores_in_headers on;
  server {{
    listen {listen} ssl;
    ssl_certificate {certs / 'server.pem'};
    ssl_certificate_key {certs / 'server.key'};
    location /v1/fleet/ {{
      proxy_pass https://127.0.0.1:{LINK_PORT};
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
    }}
    location / {{ return 403; }}
  }}
}}
""")
    return conf
