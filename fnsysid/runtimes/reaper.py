"""Ray's processes end with the run that started them, even when the run is killed (SIGKILL).

A run that starts Ray for Flower's simulation engine (:func:`fnsysid.runtimes.flower.run`)
shuts it down at its end, after an error and on SIGINT/SIGTERM. SIGKILL cannot be caught:
Ray's processes (``gcs_server``, ``raylet``, its agents and the ClientApp actors) were then
left running until Ray's own health checks ended them, about a minute later (measured 62.6 s,
docs/FEDERATED.md). Ray's public options do not tie them to the process that called
``ray.init``, so the run ties them itself, with public operating-system means only:

- before ``ray.init`` it starts a watchdog, a small Python process in a session of its own
  (so that a signal to the run's process group does not reach it), whose standard input is a
  pipe from the run;
- it marks its environment with a token (:data:`ENV`, unique to the run), which every
  process Ray starts inherits (Ray starts its services and workers with the environment of
  the process that calls ``ray.init``);
- the watchdog waits until the pipe reaches its end without a word from the run (the run
  died: the kernel closed its end) or its parent is gone, then sends SIGKILL to every process
  whose initial environment (``/proc/<pid>/environ``, Linux) holds the token, until none is
  left (at most :data:`GRACE` seconds), and exits.

When the run ends otherwise (the last round, an error, SIGINT/SIGTERM) it shuts Ray down
itself, then writes to the pipe and closes it: the watchdog exits and ends nothing. Without
``/proc`` (macOS) the watchdog ends without looking, as before.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

#: the environment variable holding the run's token
ENV = "FNSYSID_RUN_TOKEN"
#: seconds the watchdog keeps looking for the run's processes after the run ended
GRACE = 20.0

#: the watchdog's program (``python -c``; argv: token, the run's pid, GRACE)
WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
token, parent, grace = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
entry = ("%s=" + token).encode()
while os.getppid() == parent:
    ready = select.select([0], [], [], 0.2)[0]
    if ready:
        if os.read(0, 64):                  # the run closed it: Ray was shut down
            sys.exit(0)
        break                               # end of file: the run ended without closing
if not os.path.isdir("/proc"):
    sys.exit(0)
me, t0, quiet = os.getpid(), time.monotonic(), 0
while time.monotonic() - t0 < grace and quiet < 3:
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/" + name + "/environ", "rb") as f:
                if entry not in f.read().split(b"\0"):
                    continue
            os.kill(int(name), signal.SIGKILL)
            found += 1
        except OSError:
            pass
    quiet = 0 if found else quiet + 1
    time.sleep(0.1)
""" % ENV


class Reaper:
    """The watchdog of one run (a context manager): ``with Reaper(): ray.init(...) ...``.

    While it is open, ``os.environ[ENV]`` holds the run's token (processes started then
    inherit it); on exit the token is removed and the watchdog told to end without ending
    anything. Only if the process dies while it is open are the token's holders ended."""

    def __init__(self):
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.proc: subprocess.Popen | None = None
        self._saved: str | None = None

    def __enter__(self) -> Reaper:
        env = {k: v for k, v in os.environ.items() if k != ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, self.token, str(os.getpid()), str(GRACE)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, close_fds=True)
        self._saved = os.environ.get(ENV)
        os.environ[ENV] = self.token
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved
        if self.proc is not None:
            try:
                self.proc.stdin.write(b"closed")
                self.proc.stdin.close()
            except OSError:                 # the watchdog was killed: nothing to tell it
                pass
            try:
                self.proc.wait(timeout=GRACE + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
