"""The fleet's side of serving: the rings taken in each turn of the engine's poll, with the
book-keeping each says of its worker (first step, last ring, readiness), and the envs active.
`Fleet` (rlpipe/supervisor/fleet.py) carries these; they read its handles, schedule, chaos
runner and lifecycle log. The rounds themselves are the slice engine's
(rlpipe/supervisor/engine.py)."""

from __future__ import annotations

import numpy as np

ACTIVE_WINDOW_S = 10.0  # an env counts as active if its slice rang within this window


class FleetRounds:
    """Mixed into Fleet: everything here reads the fleet's own fields, and its per-slot arrays
    (`start_rounds`)."""

    def start_rounds(self, n_slots: int) -> None:
        """The per-slot book-keeping, the handles' per-slice fields made views of it."""
        self.slot_seq = np.zeros(n_slots, dtype=np.int64)  # the last ring's step
        self.parked_seq = np.full(n_slots, -1, dtype=np.int64)  # a dormant group's ring (-1: none)
        self.slot_seen = np.full(n_slots, -np.inf)  # when it last rang
        self.slot_first_step = np.zeros(n_slots)  # when it first rang with a step (0: not yet)
        self.slot_awake = np.zeros(n_slots, dtype=bool)
        self.slot_slice = np.zeros(n_slots, dtype=np.int64)  # its slice index in its worker
        for h in self.handles:
            part = slice(h.slot_lo, h.slot_lo + len(h.bounds))
            h.slice_seq, h.parked = self.slot_seq[part], self.parked_seq[part]
            self.slot_awake[part] = h.awake
            self.slot_slice[part] = np.arange(len(h.bounds))

    def take_rings(self, now: float, poll_ms: int, min_rings: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(slots, seqs) of the doorbells rung since the last turn (waiting up to `poll_ms` for
        `min_rings` of them): the awake workers' slices to serve, the current generations' rings only
        (a segment's done words are read until it is replaced). A dormant group's rings are
        parked until its wake. A few numpy calls whatever the number of rings; Python only for
        a worker's first step."""
        slots, seqs = self.doorbells.take_slots(poll_ms, min_rings)
        if not len(slots):
            return slots, seqs
        awake = self.slot_awake[slots]
        if not awake.all():
            self.parked_seq[slots[~awake]] = seqs[~awake]  # built, not stepped until its wake
            slots, seqs = slots[awake], seqs[awake]
        self.slot_seq[slots] = seqs
        self.slot_seen[slots] = now
        first = (seqs > 0) & (self.slot_first_step[slots] == 0)
        if first.any():
            self.slot_first_step[slots[first]] = now
        for slot in slots[(seqs == 1) & (self.slot_slice[slots] == 0)].tolist():
            self._worker_ready(self.by_id[int(self.slots.worker[slot])], now)  # each generation's
        return slots, seqs

    def _worker_ready(self, h, now: float) -> None:
        """The first step of a worker generation's first slice."""
        w = h.worker_id
        self.services.lifecycle.record(
            "worker_ready", worker_id=w, generation=h.generation, detail={"since_spawn_s": round(now - h.spawned_at, 3)}
        )
        if self.chaos is not None and h.spawned_awake:
            self.chaos.worker_ready(now - h.spawned_at, replacement=h.replacement)
        self.hot_unready.discard(w)
        if self.chaos is not None and self.chaos.started_at is None and not self.hot_unready:
            self.chaos.start(now)  # every hot worker (or its replacement) has stepped

    @property
    def all_slices_stepped(self) -> bool:
        return bool((self.slot_first_step > 0).all())

    def active_envs(self, now: float) -> int:
        """The envs of live workers' slices that rang within ACTIVE_WINDOW_S."""
        recent = now - self.slot_seen <= ACTIVE_WINDOW_S
        for h in self.handles:
            if not h.alive():
                recent[h.slot_lo : h.slot_lo + len(h.bounds)] = False
        return int(self.slots.count[recent].sum())
