"""WebSim: navigate a generated site; a step may hang on a socket that never answers.

One of the four emulators described in rlpipe/envs/emulators/__init__.py.
"""

from __future__ import annotations

import re
import socket
import zlib
from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import DISCRETE, EnvSpec
from rlpipe.envs.emulators.base import Emulator, check_nonneg, check_posint, check_rate

_WORDS = (
    "home",
    "news",
    "sport",
    "cart",
    "login",
    "search",
    "offer",
    "help",
    "blog",
    "about",
    "price",
    "review",
    "share",
    "video",
    "map",
    "menu",
    "account",
    "order",
    "faq",
    "deal",
)
_HREF = re.compile(r'<a href="/page/(\d+)">')
_HINT = re.compile(r'data-goal-hops="(\d+)"')
_WORD = re.compile(r"[a-z]{3,}")


@dataclass(frozen=True)
class WebParams:
    """The parameters of conf/env/web_sim.yaml, checked. No defaults: the YAML node is their one
    home (what each means is said there)."""

    n_pages: int
    n_links: int  # links per page = discrete actions
    vector_dim: int  # hashed page features + 4 navigation values
    page_kb: float
    max_steps: int
    hang_rate: float
    hang_s: float | None  # null: until the env is closed
    hang_raises: bool

    def __post_init__(self):
        for name in ("n_pages", "n_links", "max_steps"):
            check_posint(name, getattr(self, name))
        if self.n_links < 2 or self.vector_dim < 6:
            raise ValueError("web_sim needs n_links >= 2 and vector_dim >= 6")
        check_nonneg("page_kb", self.page_kb)
        check_rate("hang_rate", self.hang_rate)
        if self.hang_s is not None:
            check_nonneg("hang_s", self.hang_s)


class WebSim(Emulator):
    """A web agent: reach the goal page of a generated site by clicking links.

    Each step renders the target page as HTML (links, a hint of how many clicks remain, filler
    text) and parses it back with regular expressions into the obs vector: hashed word
    counts, then hops-to-goal, links found, step fraction, at-goal. reward: -0.01 per step,
    +1 on reaching the goal (terminated); truncated after max_steps.
    """

    Params = WebParams

    @classmethod
    def _spec(cls, p: WebParams) -> EnvSpec:
        return EnvSpec({"vector": ((p.vector_dim,), "float32")}, DISCRETE, p.n_links)

    @classmethod
    def declared_fault_rates(cls, **params) -> tuple[float, float]:
        p = WebParams(**params)
        return 0.0, (p.hang_rate if p.hang_raises else 0.0)

    def __init__(self, env_id: int, seed: int, **params):
        super().__init__(env_id, seed, **params)
        p = self.p
        self.hang_rng = np.random.default_rng([seed, 11])
        # a ring keeps the site connected; the other links are random
        self.links = self.rng.integers(0, p.n_pages, (p.n_pages, p.n_links))
        self.links[:, 0] = (np.arange(p.n_pages) + 1) % p.n_pages
        self.filler_words = max(1, int(p.page_kb * 1024 / 8))
        self._hang_sock: socket.socket | None = None
        self._closed = False
        self.hangs = 0

    def _hops_to(self, goal: int) -> np.ndarray:
        """BFS on the reversed link graph: clicks from every page to `goal`."""
        n = self.p.n_pages
        hops = np.full(n, n, dtype=np.int64)
        hops[goal] = 0
        frontier = [goal]
        while frontier:
            nxt = []
            for page in frontier:
                for src in np.nonzero((self.links == page).any(axis=1))[0]:
                    if hops[src] > hops[page] + 1:
                        hops[src] = hops[page] + 1
                        nxt.append(int(src))
            frontier = nxt
        return hops

    def _render_page(self, page: int) -> str:
        words = self.rng.integers(0, len(_WORDS), self.filler_words)
        filler = " ".join(_WORDS[i] for i in words)
        links = "".join(
            f'<li><a href="/page/{int(t)}">{_WORDS[int(t) % len(_WORDS)]}</a></li>' for t in self.links[page]
        )
        return (
            f"<html><head><title>page {page}</title></head><body data-goal-hops="
            f'"{int(self.hops[page])}"><ul>{links}</ul><p>{filler}</p></body></html>'
        )

    def _parse(self, html: str) -> np.ndarray:
        d = self.p.vector_dim - 4
        feats = np.zeros(d, dtype=np.float64)
        for w in _WORD.findall(html):
            feats[zlib.crc32(w.encode()) % d] += 1.0
        feats /= max(1.0, feats.sum())
        links = len(_HREF.findall(html))
        hint = _HINT.search(html)
        hops = int(hint.group(1)) if hint else self.p.n_pages
        nav = [min(hops, 10) / 10.0, links / self.p.n_links, self.t / self.p.max_steps, float(self.page == self.goal)]
        return np.concatenate([feats, nav]).astype(np.float32)

    def _hang(self) -> None:
        """Block on a socket that never answers, like a page whose script never returns."""
        self.hangs += 1
        rx, tx = socket.socketpair()
        self._hang_sock = tx
        try:
            rx.settimeout(self.p.hang_s)
            try:
                data = rx.recv(1)
            except socket.timeout:
                if self.p.hang_raises:
                    raise TimeoutError(f"web_sim: page load hung for {self.p.hang_s} s") from None
                return
            if not data or self._closed:
                raise ConnectionAbortedError("web_sim: closed while a page load hung")
        finally:
            self._hang_sock = None
            rx.close()
            tx.close()

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        self.goal = int(self.rng.integers(self.p.n_pages))
        self.hops = self._hops_to(self.goal)
        self.page = int(self.rng.choice(np.nonzero(self.hops > 0)[0])) if self.p.n_pages > 1 else 0
        self.t = 0
        return {"vector": self._parse(self._render_page(self.page))}

    def step(self, env_id: int, action: np.ndarray):
        if self.hang_rng.random() < self.p.hang_rate:
            self._hang()
        self.page = int(self.links[self.page, int(action) % self.p.n_links])
        self.t += 1
        obs = {"vector": self._parse(self._render_page(self.page))}
        terminated = self.page == self.goal
        reward = (1.0 if terminated else 0.0) - 0.01
        return obs, reward, terminated, self.t >= self.p.max_steps, {}

    def close(self, env_id: int) -> None:
        self._closed = True
        sock = self._hang_sock
        if sock is not None:  # wake a step blocked in _hang (another thread)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
