"""Redis clients for driver and workers alike: bounded timeouts, health checks, and TCP
keepalive probes (idle 60 s, every 10 s, 3 misses) where the url is TCP, so a connection
silently dropped by a middlebox is noticed instead of hanging."""
from __future__ import annotations

import socket

import redis


def keepalive_options() -> dict:
    opts = {}
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            opts[getattr(socket, name)] = value
    return opts


def connect(url: str, timeout_s: float = 2.0) -> redis.Redis:
    kwargs = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                  health_check_interval=30)
    if not url.startswith("unix://"):
        kwargs.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())
    return redis.Redis.from_url(url, **kwargs)
