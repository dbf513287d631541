"""An external Redis (`redis.url`) that the run cannot use at start (docs/running.md, "An
external Redis"): what no wait mends (credentials or a database the server refuses, a host no
resolver knows, an url redis-py cannot read) is bad input, one paragraph and exit 2; a server
that does not answer is waited for, then one paragraph and exit 6, and a stop signal ends the
wait. Neither message shows the url's password; nothing is left behind. Real redis-servers
(the binary the engine embeds), real CLI runs. (A reachable external Redis through a whole run:
tests/test_behaviours.py::test_external_redis_url_and_locked_board_run.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from conftest import read_summary, wait_for
from rlpipe.config import ConfigError
from rlpipe.supervisor.redis_service import (
    RedisUnreachable,
    reach_external,
    redis_server_binary,
    refused_for_good,
    shown_url,
)
from test_stopping import finish, last_line, start

PASSWORD = "s3cret-pw"


def redis_server(sock: Path, *args: str) -> subprocess.Popen:
    """A redis-server on a unix socket only, answering PING when this returns."""
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--unixsocket", str(sock), "--save", "", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=sock.parent,
    )
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.02)
    return proc


@pytest.fixture
def guarded_redis(short_tmp):
    """A real redis-server asking for PASSWORD; stopped at the end."""
    sock = short_tmp / "guarded.sock"
    proc = redis_server(sock, "--requirepass", PASSWORD)
    try:
        yield sock
    finally:
        proc.kill()
        proc.wait()


def test_shown_url_hides_only_the_password():
    assert shown_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert shown_url("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert shown_url("unix://:pw@/run/r.sock?db=0") == "unix://:***@/run/r.sock?db=0"
    assert shown_url("redis://host:6379/0") == "redis://host:6379/0"


@pytest.mark.parametrize(
    "url, reason",
    [
        ("unix://:wrong@{sock}", "refuses its credentials"),
        ("unix://{sock}", "refuses its credentials"),  # no password at all: NOAUTH
        (f"unix://:{PASSWORD}@{{sock}}?db=99", "the server refuses it"),  # 16 databases by default
        ("redis://:wrong@127.0.0.1:notaport/0", "redis-py cannot read it"),
    ],
    ids=["wrong-password", "no-password", "no-such-database", "port-not-a-number"],
)
def test_what_no_wait_mends_is_a_config_error_at_once(guarded_redis, url, reason):
    url = url.format(sock=guarded_redis)
    began = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        reach_external(url, lambda: None, wait_s=30)
    said = str(caught.value)
    assert said.startswith(f"redis.url={shown_url(url)}: ") and reason in said, said
    assert "wrong" not in said and PASSWORD not in said
    assert time.monotonic() - began < 5  # not waited for


def test_a_host_no_resolver_knows_is_bad_input_and_a_resolver_not_answering_is_waited_for():
    """As this machine's resolver answers: "no such name" is the url's fault; a resolver that
    cannot answer now (EAI_AGAIN) may answer later."""
    url = "redis://no-such-host.invalid:6379/0"
    try:
        socket.getaddrinfo("no-such-host.invalid", 6379)
        pytest.fail("no-such-host.invalid resolved")
    except socket.gaierror as exc:
        resolver_says = exc.errno
    with pytest.raises(redis.ConnectionError) as caught:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    reason = refused_for_good(caught.value)
    if resolver_says == socket.EAI_NONAME:
        assert reason is not None and "host name is not known" in reason
    else:
        assert reason is None, reason


def test_a_server_that_comes_up_during_the_wait_is_used(short_tmp):
    sock = short_tmp / "late.sock"
    tries, server = [], []

    def between_tries():
        tries.append(time.monotonic())
        if len(tries) == 3:  # not up at the first PINGs: started now
            server.append(redis_server(sock))

    try:
        reach_external(f"unix://{sock}", between_tries, wait_s=30)
        assert len(tries) == 3
    finally:
        for proc in server:
            proc.kill()
            proc.wait()


def test_a_server_that_never_answers_is_unreachable_after_the_wait(short_tmp):
    url = f"unix://:{PASSWORD}@{short_tmp / 'none.sock'}"
    began = time.monotonic()
    with pytest.raises(RedisUnreachable) as caught:
        reach_external(url, lambda: None, wait_s=1.0)
    assert 1.0 <= time.monotonic() - began < 5
    said = str(caught.value)
    assert "did not answer within 1 s" in said and "No such file" in said and PASSWORD not in said


def test_the_cli_says_bad_credentials_in_one_paragraph_exit_2_and_leaves_nothing(short_tmp, guarded_redis):
    run_dir = short_tmp / "run"
    proc = start(run_dir, f"redis.url=unix://:wrong-{PASSWORD}@{guarded_redis}")
    code, out, err = finish(proc, run_dir, [])
    paragraph = err.strip()
    assert code == 2, err[-3000:]
    assert paragraph.startswith("rlpipe: config error: redis.url=unix://:***@") and "\n" not in paragraph
    assert "refuses its credentials" in paragraph and PASSWORD not in err + out
    assert not (run_dir / "summary.json").exists()  # nothing ran: nothing to summarise


def test_the_cli_waits_for_an_unreachable_server_then_exits_6_and_a_stop_signal_ends_the_wait(short_tmp):
    """Two runs at once on a socket no server listens on: one waits out redis.start_wait_s
    and exits 6 (not 2: a supervisor may try again); the other, waiting up to a minute, gets
    SIGINT once it says it waits, and stops at once with the signal's exit code and a short
    summary."""
    url = f"redis.url=unix://{short_tmp / 'none.sock'}"
    waited = start(short_tmp / "waited" / "run", url, "redis.start_wait_s=3")
    stopped = start(short_tmp / "stopped" / "run", url, "redis.start_wait_s=60")
    stopped_out = short_tmp / "stopped" / "out.txt"
    assert wait_for(lambda: "does not answer" in stopped_out.read_text(), 60, every_s=0.05)
    asked = time.monotonic()
    stopped.send_signal(signal.SIGINT)
    code, out, err = finish(stopped, short_tmp / "stopped" / "run", [])
    assert code == 130 and time.monotonic() - asked < 5, err[-3000:]
    assert "stopped by SIGINT during start-up" in last_line(out)
    summary = read_summary(short_tmp / "stopped" / "run")
    assert summary["stopped_by"]["reason"] == "signal" and summary["env_steps"] == 0

    code, out, err = finish(waited, short_tmp / "waited" / "run", [])
    paragraph = err.strip()
    assert code == 6, err[-3000:]
    assert paragraph.startswith("rlpipe: the external Redis at redis.url=unix://") and "\n" not in paragraph
    assert "did not answer within 3 s" in paragraph and "redis.url=null" in paragraph
