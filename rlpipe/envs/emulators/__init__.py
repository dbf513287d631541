"""Emulators of the original system's troublemakers (docs/origin.md): unity_sim, physics_sim,
web_sim, faulty, one module each, on a shared base (base.py).

Each does real work (renders real pixels, integrates real dynamics, builds and parses real
pages, allocates real memory); the trouble it emulates is on top of that work, and every rate,
latency and scale is a constructor parameter with no default: its one value is in
conf/env/<type>.yaml, and those values are light (thousands of these must fit on one machine).

- UnitySim: slow warm-up (procedural texture baking for `warmup_ms` of CPU time at build),
  an rgb render of a point-mass navigation scene every step, and slow memory growth
  (`leak_bytes_per_step`, touched pages, capped at `leak_max_mb`). obs: rgb + state.
- PhysicsSim: a spring-mass chain with heavy-tailed step latency (Lomax/Pareto-II around
  `latency_base_ms`, capped at `latency_max_ms`, filled with constraint-solver iterations) and
  rewards in [-reward_scale, +reward_scale] (+-100 in conf/). obs: state + vector.
- WebSim: navigating a generated site by clicking links; each step renders and regex-parses
  an HTML page into hashed features; with probability `hang_rate` a step blocks on a socket
  that never answers for `hang_s` seconds (null: until the env is closed). obs: vector.
- Faulty: a small random-walk env that raises on reset/step/render and returns contract
  violations (wrong shape, wrong dtype, NaN, missing key, NaN reward) at configured rates.
  obs: any of state/vector/rgb (by parameters).
"""

from rlpipe.envs.emulators.faulty import Faulty
from rlpipe.envs.emulators.physics_sim import PhysicsSim
from rlpipe.envs.emulators.unity_sim import UnitySim
from rlpipe.envs.emulators.web_sim import WebSim

__all__ = ["Faulty", "PhysicsSim", "UnitySim", "WebSim"]
