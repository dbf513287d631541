"""What a slice's last step reported, copied out of its board before the slice is rung again,
and the critic's values of the final obs of its time-limit truncations (one pass per round)."""

from __future__ import annotations

import numpy as np
import torch

from rlpipe.learner.slices import SliceRef

# What the learner reads of a slice's last step (copied before the slice is rung again).
OUTCOME_FIELDS = ("reward", "terminated", "truncated", "ep_return", "ep_len", "step_ms")
SCALING_FIELDS = ("score", "exec_discrete", "exec_continuous", "behaviour_logp")


def slice_outcome(ref: SliceRef, lo: int, hi: int, fields: tuple[str, ...], obs_keys, finals: bool) -> dict:
    """A copy of the `fields` the slice's last step reported (rows lo:hi of its worker); with
    `finals`, also the rows that ended by truncation and their final obs per key."""
    res = ref.handle.views.results
    out = {k: res[k][lo:hi].copy() for k in fields}
    if finals:
        out["final_rows"] = np.flatnonzero(res["final"][lo:hi])
        out["final_obs"] = {k.name: res[f"final_{k.name}"][lo:hi][out["final_rows"]] for k in obs_keys}
    return out


def truncation_values(actor, obs_keys, device, rows, outcomes) -> list[np.ndarray | None]:
    """V(final obs) of every time-limit truncation of the round, in one critic pass: per slice
    row, an array over its envs (NaN where none truncated), or None."""
    parts = [
        (res, ref.handle.slice_types[ref.slice_index])
        for (ref, *_), res in zip(rows, outcomes)
        if res is not None and len(res["final_rows"])
    ]
    values: list[np.ndarray | None] = [None] * len(rows)
    if not parts:
        return values
    obs = {
        k.name: torch.from_numpy(np.concatenate([res["final_obs"][k.name] for res, _ in parts])).to(device)
        for k in obs_keys
    }
    types = torch.from_numpy(np.concatenate([st[res["final_rows"]] for res, st in parts]).astype(np.int64))
    v = actor.value(obs, types.to(device)).cpu().numpy()
    at = 0
    for i, res in enumerate(outcomes):
        if res is not None and len(res["final_rows"]):
            m = len(res["final_rows"])
            full = np.full(len(res["reward"]), np.nan, dtype=np.float32)
            full[res["final_rows"]] = v[at : at + m]
            values[i] = full
            at += m
    return values
