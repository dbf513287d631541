"""What the learner does with one round's obs: the actions the workers step with, and what the
rollouts keep of them (log-probs and values), for every ready row at once.

`act` runs the serving copy of the policy (`act`, or `act_explore` when gradient scaling is
on: the uniform alternative with the policy's log-prob of it, which epsilon-greedy mixes in on
the worker) over the round's rows on the learner's device; `learner.mode=random` draws uniform
actions over each row's valid entries instead. `truncation_values` is the critic's one pass
over the round's time-limit truncations (their final obs): the value their rewards bootstrap
from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Acted:
    """A round's actions (the fields the engine scatters to the workers) and what the policy
    said of them (None under random actions)."""

    send: dict  # action field -> [n, ...] (rlpipe.supervisor.slot_table's action fields)
    a_disc: np.ndarray
    a_cont: np.ndarray
    logp: np.ndarray | None = None
    value: np.ndarray | None = None


def policy_actions(actor, obs: dict, types: np.ndarray, device, explore_gen, cont_dim: int, scaling: bool) -> Acted:
    """The policy's actions on the round's obs (numpy rows, copied to `device` once)."""
    dev_obs = {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in obs.items()}
    dev_types = torch.from_numpy(types).to(device)
    send = {}
    if scaling:
        out = actor.act_explore(dev_obs, dev_types, explore_gen)
        a_disc, a_cont, logp, value = out.a_disc, out.a_cont, out.logp, out.value
        send["alt_discrete"] = out.alt_disc.cpu().numpy()
        if cont_dim:
            send["alt_continuous"] = out.alt_cont.cpu().numpy()
        send["alt_logp"] = out.alt_logp.cpu().numpy()
    else:
        a_disc, a_cont, logp, value = actor.act(dev_obs, dev_types)
    a_disc, a_cont = a_disc.cpu().numpy(), a_cont.cpu().numpy()
    logp, value = logp.cpu().numpy(), value.cpu().numpy()
    send["discrete"] = a_disc
    if cont_dim:
        send["continuous"] = a_cont
    if scaling:
        send["logp"] = logp
    return Acted(send, a_disc, a_cont, logp, value)


def random_actions(rng: np.random.Generator, disc_counts: np.ndarray, types: np.ndarray, cont_dim: int) -> Acted:
    """Uniform actions over each env's valid entries (learner.mode=random: benchmarks)."""
    a_disc = (rng.random(len(types)) * disc_counts[types]).astype(np.int64)
    if not cont_dim:  # no continuous type: the head is never written
        return Acted({"discrete": a_disc}, a_disc, np.zeros((len(types), 1), dtype=np.float32))
    a_cont = rng.uniform(-1.0, 1.0, (len(types), cont_dim)).astype(np.float32)
    return Acted({"discrete": a_disc, "continuous": a_cont}, a_disc, a_cont)


def truncation_values(actor, device, rnd) -> np.ndarray | None:
    """V(final obs) of every time-limit truncation of the round, in one critic pass: an array
    over the round's rows (NaN where none ended so), or None when none did."""
    if not len(rnd.final_rows):
        return None
    obs = {k: torch.from_numpy(v).to(device) for k, v in rnd.final_obs.items()}
    types = torch.from_numpy(rnd.types[rnd.final_rows]).to(device)
    out = np.full(rnd.n, np.nan, dtype=np.float32)
    out[rnd.final_rows] = actor.value(obs, types).cpu().numpy()
    return out
