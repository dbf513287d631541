"""Gymnasium envs written to misbehave, for the tests of issue 49 (a bad env costs one env,
never the run or the machine). Registered on import; a run reaches one as
`env_mix=gym env_mix.id=hostile_gym:<Id>` with tests/ on PYTHONPATH.

Each env is a small valid env (4 floats, 2 actions, 20-step episodes) with one hostile habit.
What a test needs to find afterwards (the pids of the processes an env started) goes to the
directory named by $HOSTILE_MARKS, one file per pid.
"""

from __future__ import annotations

import os
import subprocess

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 20
CHATTY_BYTES = 100_000  # what Chatty writes to each of fd 1 and fd 2 every step


class Plain(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), float(action), False, self.t >= EPISODE_STEPS, {}


def _mark(pid: int) -> None:
    marks = os.environ.get("HOSTILE_MARKS")
    if marks:
        open(os.path.join(marks, str(pid)), "w").close()


class Spawner(Plain):
    """Starts `sleep 3600` at construction and never waits for it: one in the worker's process
    group, one in a session of its own (setsid), the way a simulator's helper escapes."""

    def __init__(self):
        for new_session in (False, True):
            child = subprocess.Popen(["sleep", "3600"], start_new_session=new_session)
            _mark(child.pid)


class SpawnerCrash(Spawner):
    """A Spawner whose worker dies under it at its 5th step (`os._exit`: no clean-up runs),
    leaving its two sleeps to whoever adopts them."""

    def step(self, action):
        if self.t >= 4:
            os._exit(1)
        return super().step(action)


class Segfault(Plain):
    """Kills its worker with SIGSEGV (a read of address 0, as a broken native extension would)
    at its 5th step."""

    def step(self, action):
        if self.t >= 4:
            import ctypes

            ctypes.string_at(0)
        return super().step(action)


class Hog(Plain):
    """Keeps 50 MB more at every step (each page written, so it is resident)."""

    def __init__(self):
        self.hoard = []

    def step(self, action):
        self.hoard.append(b"\1" * (50 * 2**20))
        return super().step(action)


class HangOnce(Plain):
    """The first of these envs a process builds blocks in its 10th step (as a simulator
    waiting on a dead socket would); its rebuild and the others never do."""

    built = 0

    def __init__(self):
        HangOnce.built += 1
        self.hangs = HangOnce.built == 1

    def step(self, action):
        if self.hangs and self.t == 9:
            import time

            time.sleep(3600)
        return super().step(action)


class HangBeside(Plain):
    """Counts, across the envs of its process, the steps they make; the first `hangers` of
    them a process builds block in their 10th step for `hang_s` seconds (as HangOnce), and the
    first one, when its block ends (it comes back, or its deadline cuts it), writes how many
    steps its neighbours made meanwhile to $HOSTILE_MARKS as `beside_<pid>` (the probe's
    process writes its own file, told apart by its pid)."""

    built = 0
    steps = 0  # every HangBeside step of this process, hung ones excepted

    def __init__(self, hang_s: float = 3600.0, hangers: int = 1):
        HangBeside.built += 1
        self.hangs = HangBeside.built <= hangers
        self.reports = HangBeside.built == 1
        self.hang_s = hang_s

    def step(self, action):
        if self.hangs and self.t == 9:
            import time

            self.hangs = False
            before = HangBeside.steps
            try:
                time.sleep(self.hang_s)
            finally:
                marks = os.environ.get("HOSTILE_MARKS")
                if marks and self.reports:
                    with open(os.path.join(marks, f"beside_{os.getpid()}"), "w") as f:
                        f.write(str(HangBeside.steps - before))
        HangBeside.steps += 1
        return super().step(action)


class FourValues(Plain):
    """Gymnasium's old API: step returns 4 values, so every step breaks the contract."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class Chatty(Plain):
    """Writes 100 KB a step to fd 1 and fd 2 with os.write: what a C library's printf does,
    below Python's sys.stdout."""

    def step(self, action):
        os.write(1, b"o" * CHATTY_BYTES)
        os.write(2, b"e" * CHATTY_BYTES)
        return super().step(action)


for _name in ("Plain", "Spawner", "SpawnerCrash", "Segfault", "Hog", "HangOnce", "HangBeside", "FourValues", "Chatty"):
    if f"{_name}-v0" not in gym.registry:
        gym.register(f"{_name}-v0", entry_point=f"{__name__}:{_name}")
if "HangBriefly-v0" not in gym.registry:  # blocks 1 s: a stall that comes back
    gym.register("HangBriefly-v0", entry_point=f"{__name__}:HangBeside", kwargs={"hang_s": 1.0})
if "HangTwice-v0" not in gym.registry:  # the second hang falls to the thread that took over from the first
    gym.register("HangTwice-v0", entry_point=f"{__name__}:HangBeside", kwargs={"hangers": 2})
