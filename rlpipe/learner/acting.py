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


@dataclass
class Acted:
    """A round's actions (the fields the engine scatters to the workers) and what the policy
    said of them (None under random actions)."""

    send: dict  # action field -> [n, ...] (rlpipe.supervisor.slot_table's action fields)
    a_disc: np.ndarray
    a_cont: np.ndarray
    logp: np.ndarray | None = None
    value: np.ndarray | None = None


def policy_actions(actor, obs: dict, types: np.ndarray, staging, explore_gen, cont_dim: int, scaling: bool) -> Acted:
    """The policy's actions on the round's obs (numpy rows, copied to the device once through
    `staging`, a gpu_overlap.HostStaging, and its results back in one go)."""
    dev_obs = {k: staging.to_device(k, v) for k, v in obs.items()}
    dev_types = staging.to_device("types", types)
    if scaling:
        out = actor.act_explore(dev_obs, dev_types, explore_gen)
        outs = {"a_disc": out.a_disc, "a_cont": out.a_cont, "logp": out.logp, "value": out.value}
        outs |= {"alt_discrete": out.alt_disc, "alt_logp": out.alt_logp}
        if cont_dim:
            outs["alt_continuous"] = out.alt_cont
    else:
        a_disc, a_cont, logp, value = actor.act(dev_obs, dev_types)
        outs = {"a_disc": a_disc, "a_cont": a_cont, "logp": logp, "value": value}
    host = staging.to_host(outs)
    send = {k: host[k] for k in ("alt_discrete", "alt_continuous", "alt_logp") if k in host}
    send["discrete"] = host["a_disc"]
    if cont_dim:
        send["continuous"] = host["a_cont"]
    if scaling:
        send["logp"] = host["logp"]
    return Acted(send, host["a_disc"], host["a_cont"], host["logp"], host["value"])


def random_actions(rng: np.random.Generator, disc_counts: np.ndarray, types: np.ndarray, cont_dim: int) -> Acted:
    """Uniform actions over each env's valid entries (learner.mode=random: benchmarks)."""
    a_disc = (rng.random(len(types)) * disc_counts[types]).astype(np.int64)
    if not cont_dim:  # no continuous type: the head is never written
        return Acted({"discrete": a_disc}, a_disc, np.zeros((len(types), 1), dtype=np.float32))
    a_cont = rng.uniform(-1.0, 1.0, (len(types), cont_dim)).astype(np.float32)
    return Acted({"discrete": a_disc, "continuous": a_cont}, a_disc, a_cont)


def truncation_values(actor, staging, rnd) -> np.ndarray | None:
    """V(final obs) of every time-limit truncation of the round, in one critic pass: an array
    over the round's rows (NaN where none ended so), or None when none did. `staging`: a
    gpu_overlap.HostStaging (its buffers named apart from `policy_actions`')."""
    if not len(rnd.final_rows):
        return None
    obs = {k: staging.to_device(f"final/{k}", v) for k, v in rnd.final_obs.items()}
    types = staging.to_device("final/types", rnd.types[rnd.final_rows])
    out = np.full(rnd.n, np.nan, dtype=np.float32)
    out[rnd.final_rows] = staging.to_host({"final/value": actor.value(obs, types)})["final/value"]
    return out
