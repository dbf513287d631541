"""bullet_reacher: a KUKA iiwa arm (pybullet_data `kuka_iiwa/model.urdf`) reaching a target,
in PyBullet DIRECT mode, several arms per physics client.

Sharing: a DIRECT client costs ~30 MB, so the arms of one process share clients: a
process-wide pool hands out slots, `arms_per_client` per client, each arm loaded at its own
place `spacing` metres apart along x. The arm is loaded without collision shapes (inertia
from the URDF), and without visual shapes unless `render_rgb` is on: ~50 KB per arm.

Dynamics: the shared world is never stepped (stepSimulation would move every arm in the
client). Each arm integrates its own rigid-body dynamics with Bullet's Featherstone
routines: M(q) from calculateMassMatrix, Coriolis/centrifugal terms c(q, dq) from
calculateInverseDynamics with zero acceleration (gravity off, as in planar reachers), joint
damping integrated implicitly for stability:

    (M + h D) dq' = M dq + h (tau - c),   q' = q + h dq',   h = dt / substeps

with tau_j = action_j * torque_scale * M_jj(home) (so every joint has similar authority),
D = damping * diag(M(home)), |dq| <= max_velocity and q clamped to the URDF joint limits.

Task and reward (per step):
    reward = -|ee - target| - ctrl_cost * mean(action^2) + success_bonus * [|ee - target| < success_radius]
The episode terminates on success and is truncated after max_steps. Targets are the
end-effector positions of random joint configurations (always reachable).
obs: state (23) = q (7), dq / max_velocity (7), ee (3), target (3), target - ee (3), positions
relative to the arm's base; + rgb (TinyRenderer camera at rgb_shape) when render_rgb.
Continuous action (7): joint torques in [-1, 1] (scaled as above).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

from rlpipe.envs.contract import CONTINUOUS, EnvInterface, EnvSpec
from rlpipe.envs.image import as_rgb_shape

URDF = "kuka_iiwa/model.urdf"
N_JOINTS = 7
EE_LINK = 6
STATE_DIM = 2 * N_JOINTS + 9


def import_pybullet():
    """Import pybullet without its "pybullet build time" banner on stderr (printed by C code at
    import, once per process: fd 2 is pointed at /dev/null for that moment only)."""
    if "pybullet" not in sys.modules:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            import pybullet  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
    import pybullet
    import pybullet_data

    return pybullet, pybullet_data


class _Client:
    """One DIRECT physics client and its arm slots."""

    def __init__(self, capacity: int):
        p, data = import_pybullet()
        self.p = p
        self.cid = p.connect(p.DIRECT)
        p.setAdditionalSearchPath(data.getDataPath(), physicsClientId=self.cid)
        p.setGravity(0, 0, 0, physicsClientId=self.cid)
        self.slots: list[object | None] = [None] * capacity
        self.lock = threading.RLock()
        self.target_visual = None

    def free(self) -> int | None:
        for i, owner in enumerate(self.slots):
            if owner is None:
                return i
        return None

    def used(self) -> int:
        return sum(o is not None for o in self.slots)


class ClientPool:
    """Process-wide: clients are shared by the arms of one process (a worker), never across a
    fork (a child starts its own pool)."""

    _lock = threading.Lock()
    _pid = None
    _clients: list[_Client] = []

    @classmethod
    def _own(cls) -> None:
        if cls._pid != os.getpid():  # inherited through fork: not ours to use
            cls._pid = os.getpid()
            cls._clients = []

    @classmethod
    def acquire(cls, owner, capacity: int) -> tuple[_Client, int]:
        with cls._lock:
            cls._own()
            for c in cls._clients:
                if len(c.slots) == capacity:
                    slot = c.free()
                    if slot is not None:
                        c.slots[slot] = owner
                        return c, slot
            c = _Client(capacity)
            cls._clients.append(c)
            c.slots[0] = owner
            return c, 0

    @classmethod
    def release(cls, client: _Client, slot: int) -> None:
        with cls._lock:
            client.slots[slot] = None
            # keep one empty client for the next build (rebuilds are common); drop the rest
            if client.used() == 0 and sum(c.used() == 0 for c in cls._clients) > 1:
                cls._clients.remove(client)
                try:
                    client.p.disconnect(physicsClientId=client.cid)
                except Exception:
                    pass

    @classmethod
    def stats(cls) -> dict:
        with cls._lock:
            cls._own()
            return {"clients": len(cls._clients), "arms": sum(c.used() for c in cls._clients)}

    @classmethod
    def shutdown(cls) -> None:
        """Disconnect the clients no arm uses (tests, clean exit)."""
        with cls._lock:
            cls._own()
            for c in [c for c in cls._clients if c.used() == 0]:
                cls._clients.remove(c)
                c.p.disconnect(physicsClientId=c.cid)


@dataclass(frozen=True)
class ReacherParams:
    """The parameters of conf/env/bullet_reacher.yaml, checked. No defaults: the YAML node is
    their one home (what each means is said there)."""

    arms_per_client: int
    spacing: float
    max_steps: int
    dt: float
    substeps: int
    torque_scale: float  # times the joint's inertia M_jj
    damping: float
    max_velocity: float
    success_radius: float
    success_bonus: float
    ctrl_cost: float
    render_rgb: bool
    rgb_shape: tuple | list | None  # null: 64x64x3

    def __post_init__(self):
        object.__setattr__(self, "rgb_shape", as_rgb_shape(self.rgb_shape) or (64, 64, 3))
        for name in ("arms_per_client", "max_steps", "substeps"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v <= 0:
                raise ValueError(f"{name}={v!r}: allowed is a positive integer")
        for name in ("spacing", "dt", "torque_scale", "max_velocity", "success_radius"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed is a number > 0")


class BulletReacher(EnvInterface):
    Params = ReacherParams

    @classmethod
    def preload(cls, **_params) -> list[str]:
        return ["rlpipe.envs.bullet_preload"]  # pybullet and pybullet_data, quietly

    @classmethod
    def describe(cls, **params) -> EnvSpec:
        p = ReacherParams(**params)
        obs = {"state": ((STATE_DIM,), "float32")}
        if p.render_rgb:
            obs["rgb"] = (p.rgb_shape, "uint8")
        return EnvSpec(obs, CONTINUOUS, N_JOINTS)

    def __init__(self, env_id: int, seed: int, **params):
        self.cfg = ReacherParams(**params)
        self.rng = np.random.default_rng(seed)
        self.client, self.slot = ClientPool.acquire(self, self.cfg.arms_per_client)
        self.body = self.marker = None
        try:
            self._load()
        except Exception:
            self.close(env_id)
            raise
        self.t = 0

    def _load(self) -> None:
        c, pb = self.client, self.client.p
        cid = c.cid
        self.base = np.array([self.slot * self.cfg.spacing, 0.0, 0.0])
        flags = pb.URDF_USE_INERTIA_FROM_FILE | pb.URDF_IGNORE_COLLISION_SHAPES
        flags |= pb.URDF_ENABLE_CACHED_GRAPHICS_SHAPES if self.cfg.render_rgb else pb.URDF_IGNORE_VISUAL_SHAPES
        with c.lock:
            self.body = pb.loadURDF(URDF, self.base.tolist(), useFixedBase=True, flags=flags, physicsClientId=cid)
            info = [pb.getJointInfo(self.body, j, physicsClientId=cid) for j in range(N_JOINTS)]
            self.low = np.array([i[8] for i in info])
            self.high = np.array([i[9] for i in info])
            self.home = np.zeros(N_JOINTS)
            m = np.array(pb.calculateMassMatrix(self.body, self.home.tolist(), physicsClientId=cid))
            if self.cfg.render_rgb:
                if c.target_visual is None:
                    c.target_visual = pb.createVisualShape(
                        pb.GEOM_SPHERE, radius=0.05, rgbaColor=[0.9, 0.1, 0.1, 1], physicsClientId=cid
                    )
                self.marker = pb.createMultiBody(
                    baseMass=0,
                    baseVisualShapeIndex=c.target_visual,
                    basePosition=self.base.tolist(),
                    physicsClientId=cid,
                )
                h, w, _ = self.cfg.rgb_shape
                eye = self.base + [0.0, -1.9, 1.1]
                self.view = pb.computeViewMatrix(eye.tolist(), (self.base + [0, 0, 0.5]).tolist(), [0, 0, 1])
                # far plane short of the neighbouring arms (spacing apart)
                far = min(3.2, float(np.hypot(self.cfg.spacing, 1.9)) - 0.5)
                self.proj = pb.computeProjectionMatrixFOV(50, w / h, 0.1, far)
        inertia = np.diag(m).copy()
        self.tau_max = self.cfg.torque_scale * inertia
        self.damp = self.cfg.damping * inertia
        self.joints = list(range(N_JOINTS))

    def _set(self, q: np.ndarray, dq: np.ndarray) -> None:
        self.client.p.resetJointStatesMultiDof(
            self.body, self.joints, [[x] for x in q], [[x] for x in dq], physicsClientId=self.client.cid
        )

    def _ee(self) -> np.ndarray:
        state = self.client.p.getLinkState(
            self.body, EE_LINK, computeForwardKinematics=True, physicsClientId=self.client.cid
        )
        return np.asarray(state[4]) - self.base

    def _obs(self) -> dict[str, np.ndarray]:
        ee = self._ee()
        self.ee = ee
        state = np.concatenate([self.q, self.dq / self.cfg.max_velocity, ee, self.target, self.target - ee]).astype(
            np.float32
        )
        obs = {"state": state}
        if self.cfg.render_rgb:
            pb = self.client.p
            h, w, ch = self.cfg.rgb_shape
            img = pb.getCameraImage(
                w, h, self.view, self.proj, renderer=pb.ER_TINY_RENDERER, physicsClientId=self.client.cid
            )[2]
            rgba = np.asarray(img, dtype=np.uint8).reshape(h, w, 4)
            obs["rgb"] = np.ascontiguousarray(rgba[..., :ch] if ch != 1 else rgba[..., :1])
        return obs

    def reset(self, env_id: int) -> dict[str, np.ndarray]:
        with self.client.lock:
            q_goal = self.rng.uniform(0.6 * self.low, 0.6 * self.high)
            self._set(q_goal, np.zeros(N_JOINTS))
            self.target = self._ee()
            if self.marker is not None:
                self.client.p.resetBasePositionAndOrientation(
                    self.marker, (self.base + self.target).tolist(), [0, 0, 0, 1], physicsClientId=self.client.cid
                )
            self.q = np.clip(self.home + self.rng.uniform(-0.1, 0.1, N_JOINTS), self.low, self.high)
            self.dq = np.zeros(N_JOINTS)
            self._set(self.q, self.dq)
            self.t = 0
            return self._obs()

    def step(self, env_id: int, action: np.ndarray):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[:N_JOINTS], -1.0, 1.0)
        tau = a * self.tau_max
        pb, cid = self.client.p, self.client.cid
        h = self.cfg.dt / self.cfg.substeps
        zeros = [0.0] * N_JOINTS
        with self.client.lock:
            for _ in range(self.cfg.substeps):
                q, dq = self.q.tolist(), self.dq.tolist()
                m = np.array(pb.calculateMassMatrix(self.body, q, physicsClientId=cid))
                c = np.array(pb.calculateInverseDynamics(self.body, q, dq, zeros, physicsClientId=cid))
                lhs = m + h * np.diag(self.damp)
                dq_new = np.linalg.solve(lhs, m @ self.dq + h * (tau - c))
                dq_new = np.clip(dq_new, -self.cfg.max_velocity, self.cfg.max_velocity)
                q_new = self.q + h * dq_new
                at_limit = (q_new < self.low) | (q_new > self.high)
                dq_new[at_limit] = 0.0
                self.q, self.dq = np.clip(q_new, self.low, self.high), dq_new
            self._set(self.q, self.dq)
            self.t += 1
            obs = self._obs()
        dist = float(np.linalg.norm(self.target - self.ee))
        terminated = dist < self.cfg.success_radius
        reward = -dist - self.cfg.ctrl_cost * float(np.mean(a * a))
        if terminated:
            reward += self.cfg.success_bonus
        return obs, reward, terminated, self.t >= self.cfg.max_steps, {}

    def close(self, env_id: int) -> None:
        client, self.client = getattr(self, "client", None), None
        if client is None:
            return
        with client.lock:
            for body in (self.body, self.marker):
                if body is not None:
                    try:
                        client.p.removeBody(body, physicsClientId=client.cid)
                    except Exception:
                        pass
        ClientPool.release(client, self.slot)
