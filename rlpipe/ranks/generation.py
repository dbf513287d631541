"""Which attempt of a torchrun job a rank belongs to, agreed by all ranks of that attempt.

The ranks' process group and round counters live under a key prefix in the store torchrun
hands them (its agent store, kept across `--max-restarts` restarts, so earlier attempts'
keys, dead ranks' gloo addresses among them, are still there). The prefix must be new for
every attempt and the same on every rank of it. torchrun's restart count is not that: it is
per agent, and a node that was lost and came back runs a new agent counting from 0 while the
surviving nodes count 1, 2... (two hosts, a host lost and back: the ranks would wait on two
different prefixes until dist.timeout_s).

So rank 0 makes the attempt's token (its pid and clock) and hands it to every other rank on
request: a rank asks under a nonce of its own (`ask/<rank>` = nonce), rank 0 answers every
request it sees (`token/<nonce>`) until the process group is up. A nonce is fresh, so its
answer can only come from the live rank 0; a request left by a rank of an earlier attempt
gets an answer nobody reads (one short key per lost rank).
"""

from __future__ import annotations

import os
import socket
import threading
import time

ANSWER_POLL_S = 0.02


class AttemptToken:
    """`store`: this rank's client of the job's store; `connect()`: a second client, for rank
    0's answering thread (a client blocked in a wait inside init_process_group holds its
    connection)."""

    def __init__(self, store, connect, rank: int, world: int, job_id: str):
        self.store, self.connect, self.rank, self.world = store, connect, rank, world
        self.base = f"rlpipe/{job_id}/attempt/"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def agree(self) -> str:
        """This attempt's token (rank 0 starts answering the others' requests; call `done()`
        once the process group is up). A non-zero rank waits for rank 0 as long as the store's
        timeout allows (dist.timeout_s)."""
        if self.rank == 0:
            token = f"{os.getpid()}-{time.time_ns()}"
            self._thread = threading.Thread(target=self._answer, args=(token,), name="attempt-token", daemon=True)
            self._thread.start()
            return token
        nonce = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        self.store.set(f"{self.base}ask/{self.rank}", nonce)
        return self.store.get(f"{self.base}token/{nonce}").decode()

    def _answer(self, token: str) -> None:
        answered: set[str] = set()
        keys = [f"{self.base}ask/{r}" for r in range(1, self.world)]
        try:
            store = self.connect()
        except Exception:  # no store: init_process_group reports it
            return
        while not self._stop.is_set():
            try:
                for key in keys:
                    if store.check([key]):
                        nonce = store.get(key).decode()
                        if nonce not in answered:
                            store.set(f"{self.base}token/{nonce}", token)
                            answered.add(nonce)
            except Exception:  # the store is gone: init_process_group reports it
                return
            self._stop.wait(ANSWER_POLL_S)

    def done(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
