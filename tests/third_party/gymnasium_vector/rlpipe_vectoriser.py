"""What the vendored tests build instead of SyncVectorEnv(env_fns): rlpipe.vector over the same
Gymnasium id (upstream's `make_env(id, seed)` thunks become the id; each env's seed comes from
`reset(seed=...)`, seed + i, as upstream's vectors seed theirs)."""

from __future__ import annotations

import rlpipe.vector


def make_rlpipe_vector(env_id: str, num_envs: int, **options):
    return rlpipe.vector.make(env_id, num_envs, **options)
