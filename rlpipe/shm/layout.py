"""Byte layout of one worker's segment, and numpy/native views over it.

One segment per worker *generation* (`rlpipe_<run>_w<k>g<gen>`): when the watchdog replaces
a worker, its successor gets a fresh segment and the learner reads only that one, so a
replaced writer (killed, or stopped and later continued) has no way into the board the
learner reads. The header's generation word is also checked by every publish, so a stale
writer notices and stops.

    header (4096 B)     magic, owner generation, pid, OS heartbeat ns, steps, ready envs, awake,
                        envs built, lifecycle events dropped, emulated-leak bytes
    ctrl   n x 64 B     per env: seqlock word at +0 | process-shared mutex at +8 (lock board)
    obs    per key      n x 2 slots (A/B) x stride, stride = nbytes rounded up to 64
    results             rewards, end flags, episode stats, score, executed action, behaviour logp,
                        final obs of time-limit truncations (one row per env and key)
    actions             policy action (discrete i32, continuous f32[cont_dim]), logp, alternative
    error log (1 MiB)  the worker's ERROR records, pulled by the driver's aggregator
    doorbell words      per slice (n words, slices <= envs): act (driver -> worker), done
                        (worker -> driver); the worker's bell is a line of the header
                        (rlpipe.native.bell)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlpipe.native.board import BoardView, load_u64, store_u64
from rlpipe.shm.errorlog import ERROR_LOG_BYTES
from rlpipe.spec import ObsKey

ALIGN = 64
HEADER_BYTES = 4096
CTRL_BYTES = 64
MAGIC = 0x726C70697065_0003  # "rlpipe" + layout version (3: futex doorbells)

# header word offsets (uint64 each); H_BUILT: envs built so far (the watchdog's start-up
# progress); H_LC_DROPPED: lifecycle events the worker dropped at its ZMQ high-water mark;
# H_ENV_LEAK: the bytes its envs say they leak on purpose (an emulator's `leaked_bytes`), so
# the driver can tell the worker's own RSS from an emulated leak; H_STOP: nonzero once the
# driver asks the worker to stop (with its bell rung); H_ARMED: the serial of the env step in
# progress (0 between steps: the C step loop's store for its deadline), H_SLICE_LO and
# H_SLICE_SERIAL: the first env of the slice being stepped and the serial before its first
# step, so a driver that finds the worker dead knows which env it was stepping (issue 49)
(
    H_MAGIC,
    H_GENERATION,
    H_PID,
    H_OS_BEAT_NS,
    H_STEPS,
    H_READY,
    H_AWAKE,
    H_BUILT,
    H_LC_DROPPED,
    H_ENV_LEAK,
    H_STOP,
    H_ARMED,
    H_SLICE_LO,
    H_SLICE_SERIAL,
) = (8 * i for i in range(14))
# the worker's bell (rlpipe.native.bell): a cache line of its own, away from the words above
# that the worker writes on every step
H_BELL = 1024


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class WorkerLayout:
    n_envs: int
    obs_keys: tuple[ObsKey, ...]
    cont_dim: int
    ctrl_off: int
    key_offsets: tuple[int, ...]
    strides: tuple[int, ...]
    results: dict  # field -> (offset, dtype, per-env shape)
    actions: dict
    error_log_off: int  # ERROR_LOG_BYTES of JSON error records (rlpipe.shm.errorlog)
    act_off: int  # per slice: uint64 `seq + 1` of the step whose actions are written (driver)
    done_off: int  # per slice: uint64 `seq + 1` of the step published (worker)
    size: int

    @classmethod
    def build(cls, n_envs: int, obs_keys: tuple[ObsKey, ...], cont_dim: int) -> "WorkerLayout":
        off = HEADER_BYTES
        ctrl_off = off
        off += align(n_envs * CTRL_BYTES)
        key_offsets, strides = [], []
        for key in obs_keys:
            stride = align(key.nbytes)
            key_offsets.append(off)
            strides.append(stride)
            off += n_envs * 2 * stride

        def fields(spec):
            nonlocal off
            out = {}
            for name, dtype, shape in spec:
                out[name] = (off, dtype, shape)
                off += align(n_envs * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
            return out

        cd = (max(cont_dim, 1),)
        # worker -> learner, per step: reward (normalized when reward_norm is on) and the raw
        # one, end flags, finished-episode stats, stability score, and the action actually
        # executed with its behaviour log-prob (they differ from the policy's under epsilon).
        # `final` marks a time-limit truncation whose end obs is in the `final_<key>` rows
        # (the board already shows the autoreset's obs): the learner bootstraps from it.
        results = fields(
            [
                ("reward", "float32", ()),
                ("reward_raw", "float32", ()),
                ("terminated", "uint8", ()),
                ("truncated", "uint8", ()),
                ("final", "uint8", ()),
                ("step_ms", "float32", ()),
                ("ep_return", "float32", ()),
                ("ep_len", "int32", ()),
                ("score", "float32", ()),
                ("exec_discrete", "int32", ()),
                ("exec_continuous", "float32", cd),
                ("behaviour_logp", "float32", ()),
            ]
            + [(f"final_{k.name}", k.dtype, k.shape) for k in obs_keys]
        )
        # learner -> worker: the policy's action and log-prob, and a uniform alternative with
        # the policy's log-prob of it (what epsilon-greedy needs for the mixture log-prob).
        actions = fields(
            [
                ("discrete", "int32", ()),
                ("continuous", "float32", cd),
                ("logp", "float32", ()),
                ("alt_discrete", "int32", ()),
                ("alt_continuous", "float32", cd),
                ("alt_logp", "float32", ()),
            ]
        )
        log_off = off
        off += ERROR_LOG_BYTES
        # one word per slice, sized for the most slices a worker can have (one per env); each
        # array on lines of its own, as each has one writer
        act_off, done_off = off, off + align(n_envs * 8)
        off = done_off + align(n_envs * 8)
        return cls(
            n_envs,
            obs_keys,
            cont_dim,
            ctrl_off,
            tuple(key_offsets),
            tuple(strides),
            results,
            actions,
            log_off,
            act_off,
            done_off,
            off,
        )


class WorkerViews:
    """numpy views and the native board handle over one mapped worker segment."""

    def __init__(self, layout: WorkerLayout, segment, locked: bool):
        self.layout = layout
        self.segment = segment
        buf = segment.buf
        n = layout.n_envs
        self.header = np.frombuffer(buf, dtype=np.uint64, count=HEADER_BYTES // 8)
        self.header_addr = segment.base

        def view(spec):
            off, dtype, shape = spec
            return np.frombuffer(buf, dtype=dtype, count=n * int(np.prod(shape, dtype=np.int64)), offset=off).reshape(
                (n,) + tuple(shape)
            )

        self.results = {name: view(spec) for name, spec in layout.results.items()}
        self.actions = {name: view(spec) for name, spec in layout.actions.items()}
        self.error_log_buf = np.frombuffer(buf, dtype=np.uint8, count=ERROR_LOG_BYTES, offset=layout.error_log_off)
        # the doorbell words (rlpipe.shm.doorbell); the views also keep the mapping alive for the
        # native code that holds their addresses
        self.act_words = np.frombuffer(buf, dtype=np.uint64, count=n, offset=layout.act_off)
        self.done_words = np.frombuffer(buf, dtype=np.uint64, count=n, offset=layout.done_off)
        self.act_addr, self.done_addr = segment.base + layout.act_off, segment.base + layout.done_off
        self.bell_addr = segment.base + H_BELL
        self.board = BoardView(
            segment.base,
            layout.ctrl_off,
            list(layout.key_offsets),
            list(layout.strides),
            [k.nbytes for k in layout.obs_keys],
            segment.base + H_GENERATION,
            locked=locked,
            n_envs=n,
            keepalive=buf,
        )

    # header words: atomics, because the OS-beat signal handler and the watchdog race here
    def word_array(self, word: int) -> np.ndarray:
        """One header word as a writable int64 array of one element (for C code that stores
        into it, as the step loop does into H_ARMED)."""
        return self.header.view(np.int64)[word // 8 : word // 8 + 1]

    def load(self, word: int) -> int:
        return load_u64(self.header_addr + word)

    def store(self, word: int, value: int) -> None:
        store_u64(self.header_addr + word, value)

    def release(self) -> None:
        self.header = self.results = self.actions = self.board = self.error_log_buf = None
        self.act_words = self.done_words = None
