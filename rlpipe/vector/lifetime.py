"""Open vectors are closed however the process ends: at interpreter exit (atexit), on SIGTERM
(the handler closes them, then lets the signal end the process as it would have), and when
garbage-collected. Their workers also watch the process (PDEATHSIG via the forkserver, and
the doorbell timeout's pid check), so even SIGKILL leaves no worker behind; the next
vector's or run's sweep removes the segments and socket dirs of a killed one."""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref

_open: "weakref.WeakSet" = weakref.WeakSet()
_lock = threading.Lock()
_installed = False
_previous_sigterm = None


def close_all() -> None:
    for env in list(_open):
        try:
            env.close()
        except Exception:
            pass


def _on_sigterm(signum, frame) -> None:
    close_all()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    # the default action, as if we had never been here
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def register(env) -> None:
    global _installed, _previous_sigterm
    with _lock:
        _open.add(env)
        if _installed:
            return
        _installed = True
        atexit.register(close_all)
        # Only from the main thread (signal's rule), and only over the default or Python's
        # own handler: a program that set its own SIGTERM handler keeps it (and calls close).
        if threading.current_thread() is threading.main_thread():
            current = signal.getsignal(signal.SIGTERM)
            if current in (signal.SIG_DFL, None) or callable(current):
                _previous_sigterm = current if callable(current) else None
                signal.signal(signal.SIGTERM, _on_sigterm)


def unregister(env) -> None:
    with _lock:
        _open.discard(env)
