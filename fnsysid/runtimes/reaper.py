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
- while the run lives, the watchdog notes every process descended from it (pid and start
  time, from ``/proc/<pid>/stat``, every :data:`LOOK` seconds): Ray's services, agents and
  workers are its children and grandchildren until the run ends (then they are reparented);
- the run also marks its environment with a token (:data:`ENV`, unique to the run), which
  the processes Ray starts inherit; it finds a process started in the last moments before
  the end (``/proc/<pid>/environ`` is not enough alone: a process that sets its title, as
  Ray's agents do, may overwrite it);
- when the pipe reaches its end without a word from the run (the run died: the kernel closed
  its end) or its parent is gone, the watchdog sends SIGKILL to the processes it noted that
  still run (the same start time), their descendants and the token's holders, until none is
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

#: seconds between two looks of the watchdog at the run's processes
LOOK = 0.25

#: the watchdog's program (``python -c``; argv: token, the run's pid, GRACE, LOOK)
WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
token, parent, grace, look = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
entry = ("%s=" + token).encode()
me = os.getpid()


def table():
    # every running process: pid -> (parent pid, start time in clock ticks)
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/" + name + "/stat", "rb") as f:
                    rest = f.read().rsplit(b")", 1)[1].split()
                if rest[0] != b"Z":          # a zombie has ended already
                    out[int(name)] = (int(rest[1]), int(rest[19]))
            except (OSError, IndexError, ValueError):
                pass
    return out


def below(roots, procs):
    # the descendants of ``roots`` in ``procs``, pid -> start time
    kids = {}
    for pid, (ppid, start) in procs.items():
        kids.setdefault(ppid, []).append((pid, start))
    found, todo = {}, list(roots)
    while todo:
        for pid, start in kids.get(todo.pop(), []):
            if pid != me and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def holds_token(pid):
    try:
        with open("/proc/%%d/environ" %% pid, "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


proc = os.path.isdir("/proc")
known = {}                                  # the run's descendants seen so far
while os.getppid() == parent:
    if proc:
        known.update(below([parent], table()))
    if select.select([0], [], [], look)[0]:
        if os.read(0, 64):                  # the run closed it: Ray was shut down
            sys.exit(0)
        break                               # end of file: the run ended without closing
if not proc:
    sys.exit(0)
t0, quiet = time.monotonic(), 0
while time.monotonic() - t0 < grace and quiet < 5:
    procs = table()
    alive = [pid for pid, start in known.items() if procs.get(pid, (0, -1))[1] == start]
    targets = set(alive) | set(below(alive, procs))
    targets |= {pid for pid in procs if pid not in targets and pid != me and holds_token(pid)}
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    known.update(below(alive, procs))
    quiet = 0 if targets else quiet + 1
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
            [sys.executable, "-c", WATCHDOG, self.token, str(os.getpid()), str(GRACE),
             str(LOOK)],
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
