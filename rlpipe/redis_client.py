"""Redis clients for driver and workers alike, configured here once:

- bounded timeouts and a health check on idle connections;
- TCP keepalive probes (idle 60 s, every 10 s, 3 misses) where the url is TCP, so a
  connection silently dropped by a middlebox is noticed instead of hanging;
- retries: a command that fails to connect, or finds its pooled connection reset (as after
  an embedded Redis restart), is retried twice with exponential backoff (50 ms, then 100 ms)
  on a fresh connection. Timeouts are not retried: a Redis that hangs would multiply
  the 2 s timeout and stall the driver's loop.

What a caller does when Redis stays down after the retries is the caller's decision; the run
never stops for it (a worker keeps stepping, the watchdog does not read a dead Redis as dead
workers), and each such `except redis.RedisError` says why it tolerates it.
"""

from __future__ import annotations

import socket

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

RETRIES = 2
BACKOFF = ExponentialBackoff(cap=0.2, base=0.025)  # min(cap, base * 2**failures): 50 ms, 100 ms


def keepalive_options() -> dict:
    opts = {}
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            opts[getattr(socket, name)] = value
    return opts


def retry_policy() -> Retry:
    """A fresh policy per client (a Retry holds its own state)."""
    return Retry(BACKOFF, RETRIES, supported_errors=(redis.ConnectionError,))


def connect(url: str, timeout_s: float = 2.0) -> redis.Redis:
    kwargs = dict(
        socket_timeout=timeout_s, socket_connect_timeout=timeout_s, health_check_interval=30, retry=retry_policy()
    )
    if not url.startswith("unix://"):
        kwargs.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())
    return redis.Redis.from_url(url, **kwargs)
