"""The slice engine's verbs over envs stepped in the calling process: no worker process, no
shared memory, no Redis. What it is for: the learner's hot path (a Round in, actions out, the
rollout store, the episodes, the update) exercised in a unit test or a profile without a fleet.

It keeps the engine's contract (rlpipe/supervisor/engine.py): slots are the slices of the
groups the run would start (rlpipe.protocol.slot_count's numbering), every slot is ready once
its envs are built (seq 0), `recv` hands the ready slots over as one Round and `send` answers
them. Here `send` steps the slots' envs at once, in this thread, through the worker's own env
table (rlpipe/worker/envtable.py: the same autoreset, fault recovery and final obs as a
worker's), with the worker's reward normalization; so after a send the slots are ready again.

What it does not do: exploration (`scaling`) is the worker's, so a spec with it is refused;
the step deadline (`worker.step_timeout_s`) needs a worker process, so a hung env hangs the
caller here.
"""

from __future__ import annotations

import numpy as np

from rlpipe.config import RunSpec
from rlpipe.envs.registry import MixPlan, make_factory, plan_mix
from rlpipe.protocol import Round, batch_rows, slice_bounds, stepped_rows
from rlpipe.supervisor.slot_table import RESULT_FIELDS, SlotTable
from rlpipe.supervisor.workers import group_ranges
from rlpipe.worker.envtable import EnvTable
from rlpipe.worker.rewardnorm import RewardNormalizer


class InProcessEngine:
    def __init__(self, spec: RunSpec):
        if spec.scaling.enabled:
            raise ValueError("the in-process engine has no exploration: compose it with scaling.enabled=false")
        self.spec = spec
        self.plan: MixPlan | None = None
        self.table: EnvTable | None = None
        self.rnorm: RewardNormalizer | None = None
        self.ready = np.zeros(0, dtype=bool)
        self.seq = np.zeros(0, dtype=np.int64)

    def describe(self) -> MixPlan:
        spec = self.spec
        self.plan = plan_mix(spec.env_types, spec.env_count, spec.obs_keys, spec.buffer.sizing)
        return self.plan

    def start(self) -> None:
        """Every env built; every slot ready with its first obs (seq 0)."""
        spec, plan = self.spec, self.plan or self.describe()
        n = spec.env_count
        bounds = []  # each slot's env ids [lo, hi), in slot order
        for lo, hi in group_ranges(n, spec.groups.size):
            bounds += [(lo + a, lo + b) for a, b in slice_bounds(hi - lo, spec.worker.slices)]
        self.slot_lo = np.array([lo for lo, _ in bounds], dtype=np.int64)
        self.slot_count = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
        # the slot table's buffers give the results their dtypes and shapes
        shapes = SlotTable(0, [0], plan.env_type, plan.obs_keys, plan.actions.cont_dim).result_shapes
        self.results = {f: np.zeros((n,) + shape, dtype=dt) for f, (dt, shape) in shapes.items()}
        self.obs = {k.name: np.zeros((n,) + k.shape, dtype=k.dtype) for k in plan.obs_keys}
        self.final_obs = {k.name: np.zeros((n,) + k.shape, dtype=k.dtype) for k in plan.obs_keys}
        self.table = EnvTable(
            spec.env_id_offset,
            plan.env_type,
            plan.names,
            plan.specs,
            [make_factory(t.node) for t in spec.env_types],
            plan.obs_keys,
            [self.obs[k.name] for k in plan.obs_keys],
            spec.run.seed,
            final_staging=[self.final_obs[k.name] for k in plan.obs_keys],
            crash_backoff=spec.worker.crash_backoff,
        )
        for i in range(n):
            self.table.start(i)
        rn = spec.reward_norm
        if rn.mode != "off":
            self.rnorm = RewardNormalizer(n, rn.mode, rn.clip, spec.learner.gamma, plan.env_type)
        self.ready = np.ones(len(bounds), dtype=bool)
        self.seq = np.zeros(len(bounds), dtype=np.int64)

    # -- the verbs -----------------------------------------------------------------------
    def poll(self, now: float, poll_ms: int) -> np.ndarray:
        """Nothing to take: a slot is ready again as soon as `send` has stepped it."""
        return np.zeros(0, dtype=np.int64)

    def ready_mask(self) -> np.ndarray:
        return self.ready

    @property
    def has_ready(self) -> bool:
        return bool(self.ready.any())

    def recv(self, slots: np.ndarray | None = None) -> Round | None:
        """The ready slots (or `slots`) as one batch, in slot order; None when none is ready."""
        if slots is None:
            slots = np.flatnonzero(self.ready)
            if not len(slots):
                return None
        counts = self.slot_count[slots]
        starts, rows = batch_rows(self.slot_lo[slots], counts)
        seqs = self.seq[slots]
        results = {f: self.results[f][rows] for f in RESULT_FIELDS}
        stepped, final_rows = stepped_rows(seqs, counts, results["final"])
        return Round(
            slots=slots,
            seqs=seqs,
            starts=starts,
            counts=counts,
            rows=rows,
            types=self.plan.env_type[rows].astype(np.int64),
            obs={k: v[rows] for k, v in self.obs.items()},
            results=results,
            stepped=stepped,
            final_rows=final_rows,
            final_obs={k: v[rows[final_rows]] for k, v in self.final_obs.items()},
            torn_retries=0,
            restarted=np.zeros(len(slots), dtype=bool),
        )

    def send(self, slots: np.ndarray, actions: dict) -> None:
        """Step the slots' envs with `actions` (rows of `slots` one after another) now."""
        n = self.spec.env_count
        disc = np.zeros(n, dtype=np.int32)
        cont = np.zeros((n,) + self.results["exec_continuous"].shape[1:], dtype=np.float32)
        _, rows = batch_rows(self.slot_lo[slots], self.slot_count[slots])
        if "discrete" in actions:
            disc[rows] = actions["discrete"]
        if "continuous" in actions:
            cont[rows] = actions["continuous"]
        res = self.results
        for s in slots.tolist():
            lo, hi = int(self.slot_lo[s]), int(self.slot_lo[s] + self.slot_count[s])
            self.table.step_range(lo, hi, disc, cont, res)
            res["exec_discrete"][lo:hi] = disc[lo:hi]
            res["exec_continuous"][lo:hi] = cont[lo:hi]
            raw = res["reward"][lo:hi].copy()
            res["reward_raw"][lo:hi] = raw
            if self.rnorm is not None:
                ends = res["terminated"][lo:hi] | res["truncated"][lo:hi]
                res["reward"][lo:hi] = self.rnorm.normalize(lo, hi, raw, ends)
        if "logp" in actions:
            res["behaviour_logp"][rows] = actions["logp"]
        self.seq[slots] += 1
        self.ready[slots] = True

    def close(self) -> None:
        if self.table is not None:
            self.table.close_all()
