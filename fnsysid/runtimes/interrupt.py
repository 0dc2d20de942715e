"""SIGINT and SIGTERM: a run stops at the end of its current round; nothing outlives the command.

- Inside a job (:func:`job_handlers`): the first signal only sets a flag; the round loop
  checks :func:`requested` before each round and stops, and the run writes its rows so far
  with ``status: interrupted``. A second signal stops at once (the folder then has no
  ``summary.json``, which marks it incomplete).
- In the parent of a multirun (:func:`parent_handlers`): a signal raises :class:`Interrupted`,
  which makes joblib terminate its workers; the command prints one line and exits with
  128 + the signal number (130 for SIGINT, 143 for SIGTERM).
- A worker whose parent died without a word (SIGKILL) notices within a second and exits
  (:func:`watch_parent`), so no loky worker finishes its jobs orphaned.
"""

from __future__ import annotations

import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: environment variable holding the pid of the command (workers watch it)
PARENT_ENV = "FNSYSID_PARENT_PID"

_state = {"signal": None, "in_job": False, "watching": False, "abort": False}


class Interrupted(BaseException):     # not an Exception: nothing on the way may swallow it
    """The command received SIGINT or SIGTERM outside a job's round loop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def requested() -> int | None:
    """The signal received by this process, if any (checked by the round loop)."""
    return _state["signal"]


def aborted() -> bool:
    """True once a signal asked to stop at once (a second one in a job, or one outside a job):
    threads of a job that wait (a Flower server waiting for replies) give up."""
    return _state["abort"]


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + signal number."""
    return 128 + int(signum)


def _on_signal(signum, frame) -> None:
    if _state["in_job"] and _state["signal"] is None:
        _state["signal"] = signum          # stop at the end of the current round
        return
    _state["abort"] = True
    raise Interrupted(signum)


def parent_handlers() -> None:
    """Install the handlers in the command's own process and publish its pid to workers."""
    os.environ[PARENT_ENV] = str(os.getpid())
    for s in SIGNALS:
        signal.signal(s, _on_signal)


def job_handlers() -> None:
    """A job starts in this process: the next signal stops it at the end of a round."""
    _state["in_job"] = True
    for s in SIGNALS:
        signal.signal(s, _on_signal)
    parent = os.environ.get(PARENT_ENV)
    if parent and int(parent) != os.getpid():
        watch_parent(int(parent))


def job_done() -> None:
    _state["in_job"] = False


def watch_parent(pid: int, interval: float = 0.5) -> None:
    """Exit this (worker) process as soon as process ``pid`` no longer exists."""
    if _state["watching"]:
        return
    _state["watching"] = True

    direct = os.getppid() == pid      # a killed parent may linger as a zombie: watch ppid

    def watch() -> None:
        event = threading.Event()
        while not event.wait(interval):
            if (os.getppid() != pid) if direct else not _alive(pid):
                os._exit(exit_code(signal.SIGTERM))

    threading.Thread(target=watch, name="fnsysid-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie (killed, not yet reaped)."""
    import psutil

    if not psutil.pid_exists(pid):
        return False
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
