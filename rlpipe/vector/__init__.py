"""rlpipe's engine for any learner (DESIGN §8b): `rlpipe.vector.make(id_or_type, num_envs)` is
a `gymnasium.vector.VectorEnv` over the same workers, board, doorbells, step deadline,
rebuilds, watchdog, lifecycle log and embedded Redis as a training run.

    envs = rlpipe.vector.make("CartPole-v1", 64, seed=0)
    obs, info = envs.reset()
    obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
    envs.close()

rlpipe/vector/env.py says what comes back (autoreset, faults, copies); engine.py how it is
served; spaces.py how obs and actions map onto the board and the action heads.
"""

from rlpipe.vector.env import ClosedError, RlpipeVectorEnv, make

__all__ = ["ClosedError", "RlpipeVectorEnv", "make"]
