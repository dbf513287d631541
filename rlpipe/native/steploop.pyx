# cython: language_level=3, boundscheck=False, wraparound=False
"""The worker's inline step loop in C: step envs [lo, hi) under the contract, autoreset, keep
per-env episode stats, copy obs into the staging rows and write the step results.

This is EnvTable.step_one + EnvTable.finish for a whole slice without the per-env Python
bookkeeping, which cost almost half as much as a CartPole step itself (benchmarks/step_path.py:
table_python vs stepper_inline; figures in docs/benchmarks.md). Env calls stay Python calls.
Everything that is not the happy path goes back to the table: a raised exception, or an obs,
reward or flag outside the contract (the message comes from contract.check_obs), or a step
past its deadline (StepTimeout). The table records the fault and rebuilds the env by id, and
the loop writes the step as a cut episode (truncated, no finished stats), as step_one does.

With a `step_ms` result array, the wall time of each env's step() call (the env's own latency,
reset and bookkeeping excluded) is written there for the per-type latency charts; a cut step
keeps the last figure.

A time-limit truncation (truncated, not terminated) also copies the episode's end obs into
the env's final-obs rows and sets `final`: the learner bootstraps from V(final obs), which
the autoreset has replaced on the board. With `final_all` (rlpipe.vector's workers) every
ended episode's end obs is copied so. A cut episode has no end obs (`final` stays 0).

The inline step deadline (worker.stepper) watches `armed[0]`: the serial of the step in
progress, 0 between steps. The loop writes it in C around each env call, so arming is free.

An env whose `step` is a DiscreteBoxStep (rlpipe/native/gymstep.pyx: the Gymnasium adapter's
bare step for a discrete type with one flat obs) is stepped through it in C: its obs row comes
without a dict around it, and the dict is made only at an episode's end.

A step that stalls is detached from the slice (rlpipe/worker/relief.py): `detach(serial)`
raises the loop's `halt` word if that step is still in progress, and from then on the loop
writes nothing: when the env call comes back (or raises, or its deadline cuts it) the loop
returns at once with what happened in `halted`, as another thread has taken over the rest of
the slice. Envs marked in `skip` (the table's `detached`) are not stepped: their row is a cut
(1: detached; 2: rejoining, cut once more with the fresh obs it was given, then stepped).
"""
import numpy as np

cimport numpy as cnp
from cython cimport floating
from libc.math cimport isfinite
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from rlpipe.native.gymstep cimport DiscreteBoxStep

cnp.import_array()

cdef int FINITE_NONE = 0, FINITE_F32 = 1, FINITE_F64 = 2


cdef class ObsWrite:
    """One obs key of one env: what the contract expects and the staging row it goes to (a
    flat view of at least the obs's size). A row of the obs's own dtype takes a memcpy; a row
    of another dtype (a buffer of float16, say) takes numpy's cast."""
    cdef object key
    cdef int type_num
    cdef int ndim
    cdef cnp.npy_intp dims[8]
    cdef object row
    cdef char* dst
    cdef bint direct
    cdef Py_ssize_t nbytes
    cdef int finite

    def __init__(self, key, shape, dtype, cnp.ndarray row):
        dt = np.dtype(dtype)
        if len(shape) > 8:
            raise ValueError(f"obs key {key!r}: {len(shape)} dims, at most 8")
        self.key = key
        self.type_num = dt.num
        self.ndim = len(shape)
        for d in range(self.ndim):
            self.dims[d] = shape[d]
        self.nbytes = int(np.prod(shape)) * dt.itemsize
        if row.ndim != 1 or row.size != int(np.prod(shape)) or not row.flags.c_contiguous:
            raise ValueError(f"obs key {key!r}: staging row of {row.size} values for shape {tuple(shape)}")
        self.row = row
        self.dst = <char*>cnp.PyArray_DATA(row)
        self.direct = row.dtype == dt
        self.finite = FINITE_F32 if dt == np.float32 else FINITE_F64 if dt == np.float64 else FINITE_NONE


cdef bint _all_finite(const floating* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t k
    for k in range(n):
        if not isfinite(p[k]):
            return False
    return True


cdef bint _fits(cnp.ndarray a, ObsWrite w):
    """Exact dtype (native order), shape and C-contiguity; finite when it is a float key."""
    cdef Py_ssize_t k
    if cnp.PyArray_TYPE(a) != w.type_num or not cnp.PyArray_ISNOTSWAPPED(a):
        return False
    if cnp.PyArray_NDIM(a) != w.ndim or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        return False
    for k in range(w.ndim):
        if cnp.PyArray_DIMS(a)[k] != w.dims[k]:
            return False
    if w.finite == FINITE_F32:
        return _all_finite(<float*>cnp.PyArray_DATA(a), w.nbytes // 4)
    if w.finite == FINITE_F64:
        return _all_finite(<double*>cnp.PyArray_DATA(a), w.nbytes // 8)
    return True


cdef class StepLoop:
    cdef object table
    cdef list envs
    cdef list writes            # per env: tuple of ObsWrite
    cdef list final_writes      # per env: tuple of ObsWrite into its final-obs rows (or None)
    cdef list specs             # per env: its type's EnvSpec (for check_obs messages)
    cdef object check_obs
    cdef object violation
    cdef object timeout_exc
    cdef Py_ssize_t id_lo  # global id of the table's first env (EnvTable.id_lo)
    cdef double[::1] ep_return
    cdef int64_t[::1] ep_len
    cdef float[::1] r_reward
    cdef uint8_t[::1] r_term
    cdef uint8_t[::1] r_trunc
    cdef uint8_t[::1] r_final
    cdef bint has_final
    cdef bint final_all         # every end obs to the final rows, not only truncations'
    cdef float[::1] r_step_ms
    cdef bint has_step_ms
    cdef float[::1] r_ep_return
    cdef int32_t[::1] r_ep_len
    cdef int64_t[::1] armed
    cdef int64_t[::1] halt_word
    cdef uint8_t[::1] skip
    cdef public object halted   # why a halted run stopped: True (the env call came back) or its exception

    def __init__(self, table, list writes, list specs, results: dict, armed, check_obs,
                 violation, timeout_exc, list final_writes=None, bint final_all=False):
        self.table = table
        self.envs = table.envs           # the same list object: rebuilds are seen at once
        self.writes = writes
        self.specs = specs
        self.check_obs = check_obs
        self.violation = violation
        self.timeout_exc = timeout_exc
        self.id_lo = table.id_lo
        self.ep_return = table.ep_return
        self.ep_len = table.ep_len
        self.r_reward = results["reward"]
        self.r_term = results["terminated"]
        self.r_trunc = results["truncated"]
        self.final_writes = final_writes
        self.has_final = final_writes is not None
        self.final_all = final_all
        self.has_step_ms = "step_ms" in results
        if self.has_step_ms:
            self.r_step_ms = results["step_ms"]
        if self.has_final:
            self.r_final = results["final"]
        self.r_ep_return = results["ep_return"]
        self.r_ep_len = results["ep_len"]
        self.armed = armed
        self.halt_word = np.zeros(1, dtype=np.int64)
        self.skip = table.detached
        self.halted = None

    def detach(self, int64_t serial) -> bool:
        """Halt the loop if the step with this serial is still in progress (called from another
        thread; atomic under the GIL, as no Python code runs here): True when it was."""
        if serial != 0 and self.armed[0] == serial:
            self.halt_word[0] = 1
            return True
        return False

    def armed_serial(self) -> int:
        return self.armed[0]

    @property
    def halting(self) -> bool:
        return self.halt_word[0] != 0

    def rearm(self) -> None:
        """After a halted run has been dealt with: the loop steps again."""
        self.halt_word[0] = 0
        self.halted = None

    cdef void _write_obs(self, Py_ssize_t i, object obs, bint copy=True) except *:
        """Validate obs against env i's keys and (with `copy`) copy it into its staging rows,
        or raise the contract's ContractViolation with check_obs's explanation."""
        cdef tuple ws = <tuple>self.writes[i]
        cdef ObsWrite w
        cdef object value
        if type(obs) is not dict or len(<dict>obs) != len(ws):
            self.check_obs(self.specs[i], obs)
            raise self.violation(f"obs {type(obs).__name__} does not fit the declared keys")
        for w in ws:
            value = (<dict>obs).get(w.key)
            if type(value) is not np.ndarray or not _fits(<cnp.ndarray>value, w):
                self.check_obs(self.specs[i], obs)          # raises with the full explanation
                # check_obs accepts it (e.g. a non-contiguous view): take a contiguous copy
                value = np.ascontiguousarray(value)
                if not _fits(<cnp.ndarray>value, w):
                    raise self.violation(f"obs[{w.key!r}] does not fit its declared shape and dtype")
            if not copy:
                continue
            if w.direct:
                memcpy(w.dst, cnp.PyArray_DATA(<cnp.ndarray>value), w.nbytes)
            else:
                w.row[:] = value.reshape(-1)

    cdef void _write_row(self, Py_ssize_t i, object row, object key) except *:
        """_write_obs for an env of one obs key whose step gave its row without a dict (a
        DiscreteBoxStep's): validated and copied the same way, a dict made only to explain a
        misfit."""
        cdef tuple ws = <tuple>self.writes[i]
        cdef ObsWrite w
        if len(ws) == 1:
            w = <ObsWrite>ws[0]
            if w.key == key and w.direct and type(row) is np.ndarray and _fits(<cnp.ndarray>row, w):
                memcpy(w.dst, cnp.PyArray_DATA(<cnp.ndarray>row), w.nbytes)
                return
        self._write_obs(i, {key: row})

    cdef void _write_final(self, Py_ssize_t i, object obs) except *:
        """Copy a time-limit truncation's end obs (already validated) into env i's final-obs
        rows: the learner bootstraps the truncated return from its value."""
        cdef ObsWrite w
        cdef object value
        for w in <tuple>self.final_writes[i]:
            value = (<dict>obs)[w.key]
            if w.direct and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>value):
                memcpy(w.dst, cnp.PyArray_DATA(<cnp.ndarray>value), w.nbytes)
            else:
                w.row[:] = np.ascontiguousarray(value).reshape(-1)

    cdef double _reward(self, object reward) except? -1.0:
        cdef double r
        if type(reward) is float:
            r = <double>reward
        elif isinstance(reward, (float, np.floating)):
            r = float(reward)
        else:
            raise self.violation(f"reward {reward!r} is not a float")
        if not isfinite(r):
            raise self.violation(f"reward {reward!r} is not finite")
        return r

    cdef bint _flag(self, object flag) except -1:
        if flag is True:
            return 1
        if flag is False:
            return 0
        if isinstance(flag, np.bool_):
            return bool(flag)
        raise self.violation("terminated and truncated must be bools")

    def run(self, Py_ssize_t lo, Py_ssize_t hi, list actions, int64_t serial) -> int:
        """Step envs [lo, hi) with `actions` (one per env); returns the last step serial used.
        Counts of hung steps are the table's business (table.abandon)."""
        cdef Py_ssize_t i, j
        cdef object env, step, result, obs
        cdef bint bare
        cdef double r
        cdef bint term, trunc, final
        cdef timespec t0, t1
        cdef Py_ssize_t env_id
        for j in range(hi - lo):
            i = lo + j
            serial += 1  # also for a skipped env: a serial names the j-th env of the run
            if self.skip[i]:
                self._cut(i)  # detached (its step is in progress elsewhere), or rejoining once
                if self.skip[i] == 2:
                    self.skip[i] = 0  # its fresh obs goes out with this cut; stepped from the next
                continue
            env_id = self.id_lo + i
            try:
                self.armed[0] = serial
                env = self.envs[i]
                clock_gettime(CLOCK_MONOTONIC, &t0)
                step = env.step
                bare = type(step) is DiscreteBoxStep
                if bare:
                    result = (<DiscreteBoxStep>step).step(actions[j])
                else:
                    result = step(env_id, actions[j])
                if self.halt_word[0]:
                    self.armed[0] = 0
                    self.halted = True
                    return serial
                if self.has_step_ms:
                    clock_gettime(CLOCK_MONOTONIC, &t1)
                    self.r_step_ms[i] = <float>((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6)
                if type(result) is not tuple or len(<tuple>result) != 5:
                    raise self.violation("step must return (obs, reward, terminated, truncated, info)")
                obs = (<tuple>result)[0]
                r = self._reward((<tuple>result)[1])
                term = self._flag((<tuple>result)[2])
                trunc = self._flag((<tuple>result)[3])
                final = False
                if bare and not (term or trunc):  # a DiscreteBoxStep's row, no dict around it
                    self._write_row(i, obs, (<DiscreteBoxStep>step).key)
                    self._episode_goes_on(i, r)
                else:
                    if bare:
                        obs = {(<DiscreteBoxStep>step).key: obs}  # an end obs: the dict path's
                    if term or trunc:
                        self._write_obs(i, obs, False)      # the end obs keeps the contract too
                        if self.has_final and (self.final_all or (trunc and not term)):
                            self._write_final(i, obs)
                            final = True
                        self.r_ep_return[i] = <float>(self.ep_return[i] + r)
                        self.r_ep_len[i] = <int32_t>(self.ep_len[i] + 1)
                        self.ep_return[i] = 0.0
                        self.ep_len[i] = 0
                        obs = env.reset(env_id)
                        if self.halt_word[0]:
                            self.armed[0] = 0
                            self.halted = True
                            return serial
                    else:
                        self._episode_goes_on(i, r)
                    self._write_obs(i, obs)
                if self.halt_word[0]:  # (check_obs's Python ran inside: the GIL may have moved)
                    self.armed[0] = 0
                    self.halted = True
                    return serial
                self.armed[0] = 0
            except self.timeout_exc as exc:
                self.armed[0] = 0
                if self.halt_word[0]:
                    self.halted = exc
                    return serial
                self.table.abandon(i, exc, interrupted=True)
                self._cut(i)
                continue
            except Exception as exc:
                self.armed[0] = 0
                if self.halt_word[0]:
                    self.halted = exc
                    return serial
                self.table.recover(i, exc)
                self._cut(i)
                continue
            self.r_reward[i] = <float>r
            self.r_term[i] = term
            self.r_trunc[i] = trunc
            if self.has_final:
                self.r_final[i] = final
        return serial

    cdef inline void _episode_goes_on(self, Py_ssize_t i, double r) noexcept:
        self.r_ep_return[i] = 0.0
        self.r_ep_len[i] = 0
        self.ep_return[i] += r
        self.ep_len[i] += 1

    def cut(self, Py_ssize_t i) -> None:
        """Env i's row as a cut step (a detached env's, written by the thread that took over)."""
        self._cut(i)

    cdef void _cut(self, Py_ssize_t i):
        """A crashed, quarantined or hung step: the episode is cut, no finished stats."""
        self.r_reward[i] = 0.0
        self.r_term[i] = 0
        self.r_trunc[i] = 1
        if self.has_final:
            self.r_final[i] = 0
        self.r_ep_return[i] = 0.0
        self.r_ep_len[i] = 0
