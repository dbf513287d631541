"""TorchRL over rlpipe.vector (`pip install rlpipe[torchrl]`).

TorchRL's own `GymWrapper` takes an rlpipe vector as it is (TorchRL 0.14): it sees a
Gymnasium `VectorEnv` with `autoreset_mode` SAME_STEP, sets the env's batch size to
num_envs, and its `VecGymEnvTransform` puts each ended episode's end obs (`info["final_obs"]`)
in `("next", "observation")` and the next episode's first obs in the following step's
`"observation"`, as TorchRL's envs do:

    from torchrl.envs import GymWrapper
    env = GymWrapper(rlpipe.vector.make("CartPole-v1", 64, seed=0))

`make_env` below is that plus one key: a fault (an env that raised, hung past
`worker.step_timeout_s` or broke the contract, rebuilt by its worker) is a truncation, and
`"rlpipe_fault"` (bool, one per env) says which truncations were faults, so a learner can
tell them from time limits. A cut step has no end obs: TorchRL's reader fills
`("next", "observation")` of a faulted env with zeros (its rule for an env without a final
obs); the fault's kind and message are in the vector's fault records and lifecycle log.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    from torchrl.data import Binary, Composite
    from torchrl.envs import EnvBase, GymWrapper
    from torchrl.envs.gym_like import BaseInfoDictReader
except ImportError as exc:  # an extra, never required by the engine
    raise ImportError("rlpipe.vector.torchrl_env needs TorchRL: pip install rlpipe[torchrl]") from exc

from rlpipe.vector.env import make

FAULT_KEY = "rlpipe_fault"


class FaultReader(BaseInfoDictReader):
    """info["_rlpipe_fault"] (present on the steps with a fault) as a bool entry, False otherwise."""

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._info_spec = Composite({FAULT_KEY: Binary(n=1, shape=(num_envs, 1), dtype=torch.bool)}, shape=(num_envs,))

    def __call__(self, info_dict, tensordict):
        mask = info_dict.get("_" + FAULT_KEY)
        if mask is None:
            mask = np.zeros(self.num_envs, dtype=np.bool_)
        tensordict.set(FAULT_KEY, torch.as_tensor(np.asarray(mask, dtype=np.bool_)).reshape(self.num_envs, 1))
        return tensordict

    def reset(self) -> None:
        pass

    @property
    def info_spec(self) -> Composite:
        return self._info_spec


def make_env(env_id_or_type: str, num_envs: int, *, device=None, **make_options) -> EnvBase:
    """TorchRL's GymWrapper over `rlpipe.vector.make(env_id_or_type, num_envs, **make_options)`,
    with the `"rlpipe_fault"` entry. Closing the env closes the vector (its workers)."""
    vector = make(env_id_or_type, num_envs, **make_options)
    try:
        env = GymWrapper(vector, device=device)
        env.base_env.set_info_dict_reader(FaultReader(num_envs))
    except BaseException:
        vector.close()
        raise
    return env


__all__ = ["FAULT_KEY", "FaultReader", "make_env"]
