"""The PPO update in a process of its own (`learner.update_in=process`; `auto`: on a CPU learner
that serves while it trains).

Why a process: in a thread, the update shares the driver's GIL with serving. Its torch kernels
run without the GIL, but between any two of them (a minibatch is hundreds) it must take the
GIL back from the serving thread, which holds it for most of a round. Timed inside day4 on 2
CPUs (docs/benchmarks.md, "The update, timed inside day4"), the update thread used 1.06 s of
CPU in 2.4-2.8 s of wall time, and a shorter switch interval did not help. A process has its
own interpreter: the update then waits only for a CPU.

What crosses, and how:
- the policy's parameters and buffers (PopArt's statistics included) live in shared memory
  (`Module.share_memory`): the process trains them in place, and the driver's serving copy
  (the actor) takes them after each update, as it did from the thread;
- a batch is copied into shared-memory buffers that stay from update to update
  (`rlpipe.learner.batch_staging`): the pipe carries its row counts, and a buffer only when it
  is new (torch's file-descriptor passing: nothing is left in /dev/shm, whichever side dies);
  what comes back holds no tensor (stats as floats, a checkpoint's state as bytes), so the
  process never serves file descriptors;
- the optimizer and the PPO sampling stream (`generator`) live in the process; a checkpoint
  asks for their state, a resumed run hands it over before the first update.

What PPO trains on and how is the thread's, bit for bit: the same `ppo_update` on the same
batch, parameters, optimizer state and stream (tests/test_update_process.py).

The process dies with the driver (a parent-death signal, and end of input on its pipe), and
ignores SIGINT and SIGTERM: a stopped run's final update and checkpoint still need it; the
driver's teardown closes it after the final checkpoint.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import sys
import traceback
import weakref
from multiprocessing import resource_sharer

import torch
import torch.multiprocessing  # noqa: F401  registers the tensor reductions the pipe uses

from rlpipe import heap
from rlpipe.config import LearnerSpec
from rlpipe.learner.batch_staging import BatchReceiver, BatchSender
from rlpipe.learner.ppo import UpdateStats, ppo_update
from rlpipe.learner.type_settings import TypeSettings

CLOSE_TIMEOUT_S = 10.0


def updates_in_process(cfg: LearnerSpec, device: torch.device) -> bool:
    """`learner.update_in`. auto takes a process on a CPU learner whose serving goes on while
    an update trains (`learner.backlog` hold or drop). Under sync every worker waits out the
    update: nothing serves, so there is no GIL to share, and a process would only add its
    start (an interpreter importing torch, about a second of CPU: the quick start's time to
    475 rose 0.7 s) and a pipe's round trip to every update. On cuda the update's kernels are
    queued asynchronously and the GIL is not what it waits for: there the thread stays."""
    if cfg.update_in == "auto":
        return device.type == "cpu" and cfg.backlog != "sync"
    return cfg.update_in == "process"


class UpdateProcessDied(RuntimeError):
    """The update process is gone (killed, out of memory): the run cannot train on."""


class RemoteUpdate:
    """One update in flight in the process: what the learner's training side waits on, with
    a thread's `is_alive` and `join`. Its result, stats or the exception raised there, goes
    to `deliver` once the reply is read."""

    def __init__(self, owner: UpdateProcess, deliver):
        self._owner, self._deliver, self._done = owner, deliver, False

    def is_alive(self) -> bool:
        return not self.join(0)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the reply at most `timeout` seconds (None: until it comes); True once done."""
        if not self._done and self._owner.reply_ready(timeout):
            self._deliver(self._owner.reply())
            self._done = True
        return self._done


class UpdateProcess:
    """The child process that runs PPO updates on `policy` (moved to shared memory here). It
    starts on first use (`start`, or the first update): a spawned interpreter that imports
    torch takes a few seconds, so the driver starts it while its workers build their envs."""

    def __init__(self, policy: torch.nn.Module, cfg: LearnerSpec, per_type: TypeSettings, learner_cpu: int | None):
        self.policy, self.cfg, self.per_type = policy, cfg, per_type
        self.learner_cpu = learner_cpu  # worker.cpu_affinity's CPU
        self.lr = cfg.learning_rate  # the rate of the last update sent (or of a loaded state)
        self._proc = None
        self._conn = None
        self._finalizer = None
        self._batches = BatchSender()
        self._in_flight: RemoteUpdate | None = None

    @property
    def started(self) -> bool:
        return self._proc is not None

    def start(self, generator: torch.Generator, optimizer_state: dict | None) -> None:
        """Spawn the process, its PPO stream starting from `generator`'s state and its optimizer
        from `optimizer_state` (None: built on first use). Returns at once: the process imports
        torch while the driver goes on, and reads its pipe once it is up. Idempotent."""
        if self._proc is not None:
            return
        if optimizer_state is not None:
            self.lr = optimizer_state["param_groups"][0]["lr"]
        self.policy.share_memory()
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs torch threads
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(
                child_end,
                self.policy,
                self.cfg,
                self.per_type,
                (generator.get_state(), optimizer_state),
                self.learner_cpu,
            ),
            name="rlpipe-ppo-update",
            daemon=True,
        )
        self._proc.start()
        child_end.close()
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._conn)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def begin(self, batch: dict, lr: float, deliver) -> RemoteUpdate:
        """Send one update; `deliver` gets its UpdateStats (or exception) when it is read."""
        if self._in_flight is not None and not self._in_flight.join(0):
            # the batch buffers are the running update's until its reply is read
            raise RuntimeError("an update was begun while the last one was still in flight")
        self.lr = lr
        shape, fresh = self._batches.stage(batch)
        self._send(("update", shape, fresh, lr))
        self._in_flight = RemoteUpdate(self, deliver)
        return self._in_flight

    def state(self) -> tuple[dict, torch.Tensor]:
        """(the optimizer's state dict, the PPO stream's state), copied out of the process.
        Call with no update in flight."""
        return torch.load(io.BytesIO(self._call("state")), weights_only=True)

    def load(self, optimizer_state: dict, generator_state: torch.Tensor) -> None:
        """A resumed run's optimizer and stream. Call with no update in flight."""
        self.lr = optimizer_state["param_groups"][0]["lr"]
        self._call("load", optimizer_state, generator_state)

    def close(self) -> None:
        """Stop the process (waits for an update in flight at most CLOSE_TIMEOUT_S)."""
        if self._finalizer is not None:
            self._finalizer()

    # -- the pipe ----------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            raise self._died() from exc

    def reply_ready(self, timeout: float | None) -> bool:
        try:
            return self._conn.poll(timeout)
        except (EOFError, OSError) as exc:
            raise self._died() from exc

    def reply(self):
        """The next reply: its value, or the exception raised in the process."""
        try:
            ok, value = self._conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            raise self._died() from exc
        return value if ok else RuntimeError(f"the PPO update process failed:\n{value}")

    def _call(self, kind: str, *args):
        self._send((kind, *args))
        self.reply_ready(None)
        value = self.reply()
        if isinstance(value, BaseException):
            raise value
        return value

    def _died(self) -> UpdateProcessDied:
        self._proc.join(1.0)
        code = self._proc.exitcode
        return UpdateProcessDied(
            f"the PPO update process (pid {self._proc.pid}) is gone"
            + (f" with exit code {code}" if code is not None else "")
            + " (killed, out of memory, or failed at start: see its traceback above and the"
            " kernel log); the run stops here"
        )


def _stop(proc, conn) -> None:
    """Close the pipe (the process leaves at end of input), wait, then kill if it lingers.
    Then the fd-passing listener that sending tensors started in this process: its socket is
    in multiprocessing's temp dir, which the run removes before interpreter exit would."""
    try:
        conn.send(("stop",))
    except OSError:
        pass
    conn.close()
    proc.join(CLOSE_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
    resource_sharer.stop()  # started again on demand by the next tensor sent, if any


def _serve(conn, policy, cfg: LearnerSpec, per_type: TypeSettings, start_state, learner_cpu) -> None:
    """The process: updates and state requests off the pipe until "stop" or end of input."""
    from rlpipe.learner.adam import FusedAdam
    from rlpipe.procs import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when training ends
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from setproctitle import setproctitle

        setproctitle(f"rlpipe: ppo update (driver {os.getppid()})")  # what ps and the tests see
    except ImportError:
        pass
    torch.set_num_threads(cfg.torch_threads)
    heap_line = heap.keep_freed_blocks()  # not the driver's heap settings: see heap.keep_freed_blocks
    if heap_line:
        print(heap_line, file=sys.stderr)
    if learner_cpu is not None:  # worker.cpu_affinity=learner_core: the learner's own CPU
        os.sched_setaffinity(0, {learner_cpu})
    batches = BatchReceiver()
    generator_state, optimizer_state = start_state
    generator = torch.Generator()
    generator.set_state(generator_state)
    optimizer = None

    def built() -> FusedAdam:  # on first use, as the thread builds it
        nonlocal optimizer
        if optimizer is None:
            optimizer = FusedAdam(policy.parameters(), lr=cfg.learning_rate, eps=1e-5)
        return optimizer

    if optimizer_state is not None:  # a resumed run's, or the driver's before this process
        built().load_state_dict(optimizer_state)

    while True:
        try:
            kind, *args = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        try:
            value = _handle(kind, args, policy, built, generator, cfg, per_type, batches)
        except BaseException:
            conn.send((False, traceback.format_exc()))
        else:
            conn.send((True, value))


def _handle(kind, args, policy, optimizer, generator, cfg: LearnerSpec, per_type: TypeSettings, batches):
    if kind == "update":
        shape, fresh, lr = args
        args.clear()  # the buffers' references are `batches`' alone from here
        batch = batches.batch(shape, fresh)
        del fresh
        opt = optimizer()
        for group in opt.param_groups:
            group["lr"] = lr
        stats: UpdateStats = ppo_update(policy, opt, batch, cfg, generator, per_type=per_type)
        del batch  # its blocks stay in the heap for the next update's (heap.keep_freed_blocks)
        return stats
    if kind == "state":
        # as bytes: tensors sent from here would start multiprocessing's fd-passing listener in
        # this process, whose socket dir a killed driver's parent-death signal would leave behind
        data = io.BytesIO()
        torch.save((optimizer().state_dict(), generator.get_state()), data)
        return data.getvalue()
    if kind == "load":
        optimizer_state, generator_state = args
        optimizer().load_state_dict(optimizer_state)
        generator.set_state(generator_state)
        return None
    raise ValueError(f"unknown request {kind!r}")
