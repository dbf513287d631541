"""What ranks exchange: the round barrier (a counter in torchrun's store) and the collectives
of an update (one header all-reduce, one of the batch's per-type sums, one per minibatch of
gradients).

Every rank makes the same collective calls in the same order in every round: the header,
then (when the round holds any sample on any rank) the type sums, then epochs x minibatches
gradient all-reduces, the minibatch count being derived from the all-reduced global batch
size. A rank without samples in a minibatch (or in the whole round) all-reduces zeros and a
count of zero; nothing depends on a rank's local batch size. That is what keeps ranks out of
the classic deadlock of unequal collective counts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from rlpipe.learner.ppo import normalize_per_type_sums

POLL_S = 0.005  # how often a rank waiting for a round reads the store


class RankLost(RuntimeError):
    """A collective or the store failed: a peer rank is gone (or the launcher). The message is
    for the user, as is."""


def rank_lost(rank: int, world: int, what: str, exc: BaseException) -> RankLost:
    return RankLost(
        f"rank {rank}/{world}: {what} failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
        "Another rank of the job died or was stopped, or the torchrun agent is gone: this rank stops "
        "too (torchrun's failure report names the rank that failed first). Restart the job with "
        "run.resume=true (or torchrun --max-restarts=N, whose restarts resume by themselves) to "
        "continue from the run's checkpoints."
    )


@dataclass
class TypeSums:
    """Per-type sums over every rank's batch (float64, [n_types]) and the global sample count."""

    count: torch.Tensor
    ret_sum: torch.Tensor
    ret_sq: torch.Tensor
    adv_sum: torch.Tensor
    adv_sq: torch.Tensor
    samples: int


class RankSync:
    """The collectives of one rank (gloo on CPU tensors, nccl on the learner's cuda device)."""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world = rank, world
        self.device = device
        self.collectives = 0  # calls made (equal on every rank after every round)
        self.collective_s = 0.0  # wall time in them (the link, and waiting for the slowest rank)

    def all_sum(self, t: torch.Tensor, what: str) -> torch.Tensor:
        start = time.perf_counter()
        try:
            tdist.all_reduce(t)
        except Exception as exc:  # gloo/nccl raise RuntimeError or DistError subclasses
            raise rank_lost(self.rank, self.world, what, exc) from exc
        self.collective_s += time.perf_counter() - start
        self.collectives += 1
        return t

    def header(self, values: list[float]) -> list[float]:
        """Sum of a few figures over ranks (the round's header), as float64."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        return self.all_sum(t, "the update round's header all-reduce").cpu().tolist()

    def type_sums(self, ret: torch.Tensor, adv: torch.Tensor, types: torch.Tensor, n_types: int) -> TypeSums:
        t = types.to(self.device)
        r = ret.to(self.device, torch.float64)
        a = adv.to(self.device, torch.float64)
        out = torch.zeros(5 * n_types + 1, dtype=torch.float64, device=self.device)
        out[0:n_types] = torch.bincount(t, minlength=n_types).to(torch.float64)
        for k, x in enumerate((r, r * r, a, a * a), start=1):
            out[k * n_types : (k + 1) * n_types].index_add_(0, t, x)
        out[-1] = len(ret)
        self.all_sum(out, "the all-reduce of the batch's per-type statistics")
        out = out.cpu()
        parts = [out[k * n_types : (k + 1) * n_types] for k in range(5)]
        return TypeSums(*parts, samples=int(out[-1].item()))

    def batch_statistics(
        self, policy, batch: dict, cfg, beta, adv_floor=None
    ) -> tuple[torch.Tensor, int, torch.Tensor]:
        """`ppo.WholeBatch.batch_statistics` over every rank's batch: PopArt and the per-type
        advantage normalization from the all-reduced sums (one all-reduce), the minibatch count
        from the global sample count, each type's count over every rank (so every rank paces
        the log std alike)."""
        types, adv = batch["types"], batch["adv"]
        m = self.type_sums(batch["ret"], adv, types, len(policy.popart.mu))
        if cfg.value_norm == "popart":
            policy.popart.update_sums(m.count, m.ret_sum, m.ret_sq, beta, policy.critic.out)
        if cfg.adv_norm == "per_type":
            adv = normalize_per_type_sums(adv, types, m.count, m.adv_sum, m.adv_sq, adv_floor)
        return adv, max(math.ceil(m.samples / cfg.minibatch_size), 1), m.count.round().to(torch.int64)

    def average_gradients(self, params: list[torch.nn.Parameter], samples: int) -> bool:
        """Replace each parameter's gradient with the sample-weighted mean over ranks: each rank
        sends grad * samples (its loss is a mean over its `samples` rows), the sum is divided
        by the global sample count. A parameter no rank produced a gradient for keeps None
        (Adam leaves it alone, as on one rank). Returns False when no rank had a sample in
        this minibatch: every rank then skips the optimizer step."""
        if not params:
            return samples > 0
        dev = params[0].device
        flat = torch.cat(
            [
                (p.grad.reshape(-1) * samples)
                if p.grad is not None
                else torch.zeros(p.numel(), dtype=p.dtype, device=dev)
                for p in params
            ]
            + [
                torch.tensor(
                    [float(samples)] + [float(p.grad is not None) for p in params], dtype=params[0].dtype, device=dev
                )
            ]
        )
        self.all_sum(flat, "the gradient all-reduce")
        n_grad = sum(p.numel() for p in params)
        total = float(flat[n_grad].item())
        has = flat[n_grad + 1 :].tolist()
        if total <= 0:
            for p in params:
                p.grad = None
            return False
        at = 0
        for p, h in zip(params, has):
            n = p.numel()
            p.grad = (flat[at : at + n] / total).view_as(p) if h > 0 else None
            at += n
        return True


class Rounds:
    """When the next update round starts, through counters in torchrun's store.

    A rank whose learner holds its share of `update_envs` env-rollouts announces it once per
    round (`ready/<round>` += 1). Every rank polls the counter; once ceil(sync_frac x world)
    ranks have announced, each rank starts the round at its next poll with the complete
    rollouts it holds: a straggler's partial rollouts are not waited for (DD-PPO's
    preemption) and keep collecting for the next round, so nothing is thrown away. A rank
    that wants the run to end (its run.duration_s passed) sets `stop`, which starts the next
    round on every rank at once; that round's header then ends the run everywhere.
    """

    def __init__(self, store, rank: int, world: int, sync_frac: float, timeout_s: float = float("inf")):
        self.store = store
        self.timeout_s = timeout_s  # announced and waited longer: a peer is gone (its host lost)
        self.announced_at = 0.0
        self.rank, self.world = rank, world
        self.need = max(1, min(world, math.ceil(sync_frac * world - 1e-9)))
        self.round = 0
        self.announced = False
        self.stop_sent = False
        self.next_poll = 0.0

    def _add(self, key: str, amount: int) -> int:
        try:
            return int(self.store.add(key, amount))
        except Exception as exc:
            raise rank_lost(self.rank, self.world, f"the round store ({key})", exc) from exc

    def due(self, have_rollout: bool, want_stop: bool) -> bool:
        """Whether this rank starts round `self.round` now."""
        if want_stop and not self.stop_sent:
            self._add("stop", 1)
            self.stop_sent = True
        if have_rollout and not self.announced:
            self._add(f"ready/{self.round}", 1)
            self.announced = True
            self.announced_at = time.monotonic()
        now = time.monotonic()
        if now < self.next_poll:
            return False
        self.next_poll = now + POLL_S
        ready = self._add(f"ready/{self.round}", 0)
        if self.stop_sent or ready >= self.need:
            return True
        if self._add("stop", 0) > 0:
            return True
        if self.announced and now - self.announced_at > self.timeout_s:
            # the store is this job's (it answers), but too few ranks announce: a lost host's
            # rank never will, and no collective is in flight to time out instead
            raise RankLost(
                f"rank {self.rank}/{self.world}: update round {self.round} had {ready} of the {self.need} "
                f"ranks it needs ready after dist.timeout_s={self.timeout_s:g} s: a peer rank is gone or "
                "stalled (its host lost?). This rank stops; torchrun --max-restarts=N restarts the job "
                "from its checkpoints when the host is back, or restart it with run.resume=auto."
            )
        return False

    def begin(self) -> bool:
        """This rank starts the round; returns whether it had its rollout (False: preempted)."""
        had = self.announced
        if self.round >= 2:  # every rank has started round - 1, so round - 2 is done with
            try:
                self.store.delete_key(f"ready/{self.round - 2}")
            except Exception:
                pass
        self.round += 1
        self.announced = False
        return had
