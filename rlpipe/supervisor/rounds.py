"""The fleet's side of serving: the rings taken in each turn of the engine's poll, with the
book-keeping each says of its worker (first step, last ring, readiness), and the envs active.
`Fleet` (rlpipe/supervisor/fleet.py) carries these; they read its handles, schedule, chaos
runner and lifecycle log. The rounds themselves are the slice engine's
(rlpipe/supervisor/engine.py)."""

from __future__ import annotations

from rlpipe.supervisor.workers import SliceRef

ACTIVE_WINDOW_S = 10.0  # an env counts as active if its slice rang within this window


class FleetRounds:
    """Mixed into Fleet: everything here reads the fleet's own fields."""

    def take_rings(self, now: float, poll_ms: int) -> list[SliceRef]:
        """The doorbells rung since the last turn (waiting up to `poll_ms` for the first): the
        awake workers' slices to serve. A dormant group's rings are parked until its wake."""
        refs: list[SliceRef] = []
        by_id = self.by_id
        for w, s, seq in self.doorbells.take(poll_ms):  # the current generations' rings only
            h = by_id[w]
            gen = h.generation
            ref = SliceRef(h, s, seq, gen)
            if not h.awake:
                h.parked.append(ref)  # dormant: built, not stepped until its wake
                continue
            refs.append(ref)
            h.slice_seq[s] = seq
            self.slice_seen[(w, s)] = now
            if seq == 1 and s == 0:
                self.services.lifecycle.record(
                    "worker_ready", worker_id=w, generation=gen, detail={"since_spawn_s": round(now - h.spawned_at, 3)}
                )
                if self.chaos is not None and h.spawned_awake:
                    self.chaos.worker_ready(now - h.spawned_at, replacement=h.replacement)
                self.hot_unready.discard(w)
                if self.chaos is not None and self.chaos.started_at is None and not self.hot_unready:
                    self.chaos.start(now)  # every hot worker (or its replacement) has stepped
            if seq > 0 and (w, s) not in self.slice_first_step:
                self.slice_first_step[(w, s)] = now
        return refs

    @property
    def all_slices_stepped(self) -> bool:
        return len(self.slice_first_step) == self.n_slices

    def active_envs(self, now: float) -> int:
        return sum(
            h.bounds[s][1] - h.bounds[s][0]
            for h in self.handles
            if h.alive()
            for s in range(len(h.bounds))
            if now - self.slice_seen.get((h.worker_id, s), -1e9) <= ACTIVE_WINDOW_S
        )
