"""Env types and the contract they keep (docs/architecture.md, Environments).

contract   EnvInterface, EnvSpec, the checker (check_obs/check_step/check_fits)
registry   one factory per type (make_factory), describe, the run's MixPlan and action heads
sizing     the board grown to what the mix's types describe (buffer=auto)
classic    GymnasiumEnv: any Gymnasium id, spaces mapped onto the contract
bullet     BulletReacher: a KUKA arm in PyBullet DIRECT mode, clients shared per process
emulators  UnitySim, PhysicsSim, WebSim, Faulty (one module each, a shared base): the troublemakers
           of docs/origin.md
image      nearest resize of frames onto the board's rgb shape
validate   day0: build, cycle and time every type of a mix (env_validation.json/.md)
"""

from rlpipe.envs.classic import GymnasiumEnv
from rlpipe.envs.contract import (
    CONTINUOUS,
    DISCRETE,
    ContractViolation,
    EnvInterface,
    EnvSpec,
    check_fits,
    check_obs,
    check_step,
)
from rlpipe.envs.registry import ActionSpace, MixPlan, assign_types, describe, make_factory, plan_mix

__all__ = [
    "CONTINUOUS",
    "DISCRETE",
    "ActionSpace",
    "ContractViolation",
    "EnvInterface",
    "EnvSpec",
    "GymnasiumEnv",
    "MixPlan",
    "assign_types",
    "check_fits",
    "check_obs",
    "check_step",
    "describe",
    "make_factory",
    "plan_mix",
]
