"""Obs-board figures: torn-read stress, seqlock vs lock board, native gather vs memcpy and numpy.

    python benchmarks/board.py             # a readable table
    python benchmarks/board.py --json      # the same, then one JSON line (the last line of stdout)

Phases (every number below is measured in this run, on this machine):

1. Torn-read stress. One writer process laps two reader processes. Every row carries its own
   checksum: word 0 is a tag (writer id, publish number), the body is random, the last word is
   (tag + sum(body)) ^ MAGIC. A read accepted by the seqlock is then checked: `torn_accepted`
   counts accepted reads that fail the checksum, disagree across keys, or go back in time
   (`torn_stale`). Two parts, summed: (a) buffer `small` (rgb, state, vector) on 4 envs until
   --reads checked reads; (b) the original system's shapes with rgb as float32 on 2 envs for
   --lap-seconds, where a reader's copy takes as long as a publish, so the writer laps it
   constantly (`lap_*`). The readers also do one unchecked read (the original double buffer,
   docs/origin.md:
   read the published slot, no re-check) per four checked ones: `torn_unchecked` > 0 shows
   that the stress really tears what the seqlock's re-check rejects (`torn_retries`).
2. Sync ablation. Two writer processes (half the envs each) publish as fast as they can while
   one reader process gathers all envs, for the same duration on the seqlock board and on the
   lock board (robust per-env mutex), rounds alternating. `*_obs_per_s` is what the reader
   (the learner's inference) gets; `*_write_obs_per_s` what the writers publish meanwhile;
   `seqlock_over_lock_all` compares reads + writes. The headline uses the default board
   (`conf/buffer/state_only`, 256 envs); `*_seed_*` repeats it with the original system's shapes.
3. Gather bandwidth. Native gather of 256 rgb 224x224x3 uint8 obs (a list of env ids) into
   one contiguous array, against np.copyto of the same number of bytes (the physical limit).
4. Small obs. Gather of 256 state-only obs (random env ids): the native call against the
   original system's get_batch (a Python loop of numpy slices picking the published slot +
   np.stack).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rlpipe.shm.payloads import Payloads, check_rows
from rlpipe.native.board import BoardView  # noqa: E402
from rlpipe.shm.segment import Segment, new_run_id, segment_name  # noqa: E402

GEN = 1


# --- geometry: built with the engine's layout in the parent, plain values for the children ----

def make_board(buffer: str, n_envs: int, locked: bool, rgb_dtype: str | None = None):
    """Create a worker segment for conf/buffer/<buffer>.yaml; returns (segment, geometry)."""
    from rlpipe.spec import ObsKey
    from rlpipe.shm.layout import H_GENERATION, WorkerLayout, WorkerViews
    import yaml

    spec = yaml.safe_load((REPO / "conf" / "buffer" / f"{buffer}.yaml").read_text())
    keys = []
    for name in ("rgb", "state", "vector"):
        if name in spec["keys"]:
            dtype = rgb_dtype if (name == "rgb" and rgb_dtype) else spec["keys"][name]["dtype"]
            keys.append(ObsKey(name, tuple(spec["keys"][name]["shape"]), dtype))
    layout = WorkerLayout.build(n_envs, tuple(keys), 0)
    seg = Segment.create(segment_name(new_run_id(), f"bench{buffer}"), layout.size)
    views = WorkerViews(layout, seg, locked=locked)
    views.store(H_GENERATION, GEN)
    if locked:
        views.board.init_locks(n_envs)
    views.release()
    geo = dict(name=seg.name, ctrl_off=layout.ctrl_off, key_offsets=list(layout.key_offsets),
               strides=list(layout.strides), row_bytes=[k.nbytes for k in keys],
               gen_off=H_GENERATION, n_envs=n_envs, locked=locked,
               keys=[(k.name, k.shape, k.dtype) for k in keys])
    return seg, geo


def open_board(geo):
    seg = Segment.attach(geo["name"])
    board = BoardView(seg.base, geo["ctrl_off"], geo["key_offsets"], geo["strides"], geo["row_bytes"],
                      seg.base + geo["gen_off"], locked=geo["locked"], n_envs=geo["n_envs"],
                      keepalive=seg.buf)
    return seg, board


# --- child processes ------------------------------------------------------------------------

def stress_writer(geo, stop, out_q):
    seg, board = open_board(geo)
    n = geo["n_envs"]
    pay = Payloads(geo["row_bytes"], n, writer_id=1, seed=1)
    k = 0
    while not stop.value:
        k += 1
        if board.publish(pay.fill(k), pay.strides, 0, n, GEN) < 0:
            break
    out_q.put({"publishes": k})
    del board
    seg.close()


def stress_reader(geo, target_reads, max_s, stop, out_q):
    seg, board = open_board(geo)
    n = geo["n_envs"]
    outs = [np.zeros((n, rb // 8), dtype=np.uint64) for rb in geo["row_bytes"]]
    ptrs = [o.ctypes.data for o in outs]
    strides = [o.strides[0] for o in outs]
    last = np.zeros(n, dtype=np.uint64)
    reads = torn = stale = retries = unchecked = torn_unchecked = 0
    t0 = time.perf_counter()
    i = 0
    while reads < target_reads and time.perf_counter() - t0 < max_s and not stop.value:
        i += 1
        if i % 5 == 0:                                    # the original system's read, for contrast
            board.gather_unchecked(ptrs, strides, 0, n)
            ok, _ = check_rows(outs, n)
            unchecked += n
            torn_unchecked += int(n - ok.sum())
            continue
        retries += board.gather(ptrs, strides, 0, n)
        ok, tags = check_rows(outs, n)
        reads += n
        torn += int(n - ok.sum())
        good = np.where(ok, tags, last)
        stale += int((good < last).sum())
        np.maximum(last, good, out=last)
    out_q.put({"reads": reads, "torn": torn, "stale": stale, "retries": retries,
               "unchecked": unchecked, "torn_unchecked": torn_unchecked,
               "s": time.perf_counter() - t0})
    del board
    seg.close()


def tp_worker(geo, role, lo, count, stop, start, out_q):
    seg, board = open_board(geo)
    bufs = [np.full((count, rb), 7, dtype=np.uint8) for rb in geo["row_bytes"]]
    ptrs = [b.ctypes.data for b in bufs]
    strides = [b.strides[0] for b in bufs]
    if role == "w":                                       # both slots hold a row before timing
        board.publish(ptrs, strides, lo, count, GEN)
        board.publish(ptrs, strides, lo, count, GEN)
    start.wait()
    ops = retries = 0
    t0 = time.perf_counter()
    if role == "w":
        while not stop.value:
            board.publish(ptrs, strides, lo, count, GEN)
            ops += count
    else:
        while not stop.value:
            retries += board.gather(ptrs, strides, lo, count)
            ops += count
    out_q.put((role, ops / (time.perf_counter() - t0), retries))
    del board
    seg.close()


# --- phases ---------------------------------------------------------------------------------

def torn_stress(ctx, target_reads: int, max_s: float, n_envs: int = 16, buffer: str = "small",
                rgb_dtype: str | None = None) -> dict:
    seg, geo = make_board(buffer, n_envs, locked=False, rgb_dtype=rgb_dtype)
    try:
        stop, q = ctx.RawValue("i", 0), ctx.Queue()
        writer = ctx.Process(target=stress_writer, args=(geo, stop, q))
        writer.start()
        view_seg, board = open_board(geo)
        deadline = time.monotonic() + 30
        while board.seq(n_envs - 1) < 4 and time.monotonic() < deadline:   # both slots written
            time.sleep(0.01)
        del board
        view_seg.close()
        readers = [ctx.Process(target=stress_reader, args=(geo, target_reads // 2 + 1, max_s, stop, q))
                   for _ in range(2)]
        for r in readers:
            r.start()
        reports = [q.get(timeout=max_s + 60) for _ in readers]
        stop.value = 1
        reports.append(q.get(timeout=30))
        for p in readers + [writer]:
            p.join(10)
    finally:
        seg.unlink()
        seg.close()
    rd = [r for r in reports if "reads" in r]

    def total(key):
        return sum(r[key] for r in rd)
    return {"torn_accepted": total("torn") + total("stale"), "reads": total("reads"),
            "torn_stale": total("stale"), "torn_retries": total("retries"),
            "torn_unchecked": total("torn_unchecked"), "unchecked_reads": total("unchecked"),
            "stress_publishes": sum(r.get("publishes", 0) for r in reports) * n_envs,
            "stress_s": max(r["s"] for r in rd)}


def sync_round(ctx, buffer: str, locked: bool, n_envs: int, seconds: float) -> tuple[float, float, int]:
    """One timed round: (reader obs/s, writers' obs/s, reader retries)."""
    seg, geo = make_board(buffer, n_envs, locked)
    try:
        stop, start, q = ctx.RawValue("i", 0), ctx.Barrier(4), ctx.Queue()
        half = n_envs // 2
        procs = [ctx.Process(target=tp_worker, args=(geo, "w", 0, half, stop, start, q)),
                 ctx.Process(target=tp_worker, args=(geo, "w", half, n_envs - half, stop, start, q)),
                 ctx.Process(target=tp_worker, args=(geo, "r", 0, n_envs, stop, start, q))]
        for p in procs:
            p.start()
        start.wait(timeout=60)
        time.sleep(seconds)
        stop.value = 1
        rates = [q.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(10)
    finally:
        seg.unlink()
        seg.close()
    read = sum(v for role, v, _ in rates if role == "r")
    write = sum(v for role, v, _ in rates if role == "w")
    return read, write, sum(r for _, _, r in rates)


def sync_ablation(ctx, buffer: str, n_envs: int, seconds: float, rounds: int) -> dict:
    res = {False: [], True: []}
    for _ in range(rounds):
        for locked in (False, True):
            res[locked].append(sync_round(ctx, buffer, locked, n_envs, seconds / rounds))
    def mean(locked, i):
        return float(np.mean([x[i] for x in res[locked]]))
    return {"seqlock_read": mean(False, 0), "seqlock_write": mean(False, 1),
            "lock_read": mean(True, 0), "lock_write": mean(True, 1),
            "seqlock_retries": sum(x[2] for x in res[False])}


def _best(fn, reps: int, min_s: float = 0.0) -> float:
    """Best wall time of fn() over at least `reps` calls (and at least min_s seconds)."""
    best = float("inf")
    t_end = time.perf_counter() + min_s
    i = 0
    while i < reps or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        i += 1
    return best


def gather_bandwidth(batch: int = 256, reps: int = 15) -> dict:
    seg, geo = make_board("seed", batch, locked=False)
    try:
        geo = dict(geo, key_offsets=geo["key_offsets"][:1], strides=geo["strides"][:1],
                   row_bytes=geo["row_bytes"][:1])             # rgb only
        view_seg, board = open_board(geo)
        rb = geo["row_bytes"][0]
        src = np.random.default_rng(0).integers(0, 255, size=(batch, rb), dtype=np.uint8)
        board.publish([src.ctypes.data], [rb], 0, batch, GEN)
        board.publish([src.ctypes.data], [rb], 0, batch, GEN)
        out = np.zeros((batch, 224, 224, 3), dtype=np.uint8)
        idx = np.random.default_rng(1).permutation(batch).astype(np.int64)
        ptrs, strides = [out.ctypes.data], [rb]
        t_gather = _best(lambda: board.gather(ptrs, strides, 0, batch, idx), reps)
        assert np.array_equal(out.reshape(batch, rb), src[idx])
        a = np.random.default_rng(2).integers(0, 255, size=batch * rb, dtype=np.uint8)
        b = np.zeros_like(a)
        t_copy = _best(lambda: np.copyto(b, a), reps)
        del board
        view_seg.close()
    finally:
        seg.unlink()
        seg.close()
    nbytes = batch * rb
    return {"gather_gbps": nbytes / t_gather / 1e9, "memcpy_gbps": nbytes / t_copy / 1e9,
            "gather_bytes": nbytes}


def small_gather(batch: int = 256, n_envs: int = 1024, min_s: float = 1.0) -> dict:
    seg, geo = make_board("state_only", n_envs, locked=False)
    try:
        view_seg, board = open_board(geo)
        rb, stride = geo["row_bytes"][0], geo["strides"][0]
        src = np.random.default_rng(0).standard_normal((n_envs, rb // 4)).astype(np.float32)
        for _ in range(3):                                   # env i's seq ends odd/even mixed
            board.publish([src.ctypes.data], [rb], 0, n_envs, GEN)
        board.publish([src.ctypes.data], [rb], 0, n_envs // 2, GEN)
        idx = np.random.default_rng(1).choice(n_envs, batch, replace=False).astype(np.int64)
        out = np.zeros((batch, rb // 4), dtype=np.float32)
        ptrs, strides = [out.ctypes.data], [rb]
        t_native = _best(lambda: board.gather(ptrs, strides, 0, batch, idx), 50, min_s)
        native = out.copy()

        # the original get_batch: per env, read the published-slot index, take that slot's row
        u8 = np.frombuffer(seg.buf, dtype=np.uint8)
        slots = u8[geo["key_offsets"][0]:geo["key_offsets"][0] + n_envs * 2 * stride] \
            .view(np.float32).reshape(n_envs, 2, stride // 4)[:, :, :rb // 4]
        ctrl = u8[geo["ctrl_off"]:geo["ctrl_off"] + n_envs * 64].view(np.uint64).reshape(n_envs, 8)[:, 0]
        ids = idx.tolist()

        def npstack():
            rows = []
            for e in ids:
                rows.append(slots[e, (int(ctrl[e]) >> 1) & 1])
            return np.stack(rows)

        t_np = _best(npstack, 50, min_s)
        assert np.array_equal(npstack(), native) and np.array_equal(native, src[idx])
        del board, slots, ctrl, u8
        view_seg.close()
    finally:
        seg.unlink()
        seg.close()
    return {"native_obs_per_s": batch / t_native, "npstack_obs_per_s": batch / t_np,
            "native_gather_us": t_native * 1e6, "npstack_us": t_np * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    ap.add_argument("--seconds", type=float, default=6.0,
                    help="time of each board in the sync ablation, split over --rounds "
                         "(the seed-shaped repeat takes half of it)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating seqlock/lock rounds")
    ap.add_argument("--reads", type=int, default=1_000_000, help="checked reads in the torn stress")
    ap.add_argument("--stress-max-s", type=float, default=30.0, help="time cap of the torn stress")
    ap.add_argument("--lap-seconds", type=float, default=3.0,
                    help="duration of the float32-rgb part of the torn stress")
    ap.add_argument("--envs", type=int, default=256, help="envs on the sync-ablation board")
    ap.add_argument("--no-seed-ablation", action="store_true",
                    help="skip the sync ablation with the original system's (seed) shapes")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()

    res: dict = {"load1_start": round(os.getloadavg()[0], 2)}
    # (a) many reads: buffer `small` (rgb 64x64x3, state, vector) on 4 envs until --reads;
    # (b) hard laps: the original rgb as float32 (600 KB rows, a copy as long as a publish).
    a = torn_stress(ctx, args.reads, args.stress_max_s, n_envs=4, buffer="small")
    b = torn_stress(ctx, 10**9, args.lap_seconds, n_envs=2, buffer="seed", rgb_dtype="float32")
    for key in ("torn_accepted", "reads", "torn_stale", "torn_retries", "torn_unchecked",
                "unchecked_reads", "stress_publishes", "stress_s"):
        res[key] = a[key] + b[key]
    res.update({"lap_reads": b["reads"], "lap_retries": b["torn_retries"],
                "lap_torn_unchecked": b["torn_unchecked"]})
    abl = sync_ablation(ctx, "state_only", args.envs, args.seconds, args.rounds)
    res.update({"seqlock_obs_per_s": abl["seqlock_read"], "lock_obs_per_s": abl["lock_read"],
                "seqlock_write_obs_per_s": abl["seqlock_write"], "lock_write_obs_per_s": abl["lock_write"],
                "seqlock_read_retries": abl["seqlock_retries"]})
    if not args.no_seed_ablation:
        abl = sync_ablation(ctx, "seed", args.envs, args.seconds / 2, max(1, args.rounds // 2))
        res.update({"seqlock_seed_obs_per_s": abl["seqlock_read"], "lock_seed_obs_per_s": abl["lock_read"],
                    "seqlock_seed_write_obs_per_s": abl["seqlock_write"],
                    "lock_seed_write_obs_per_s": abl["lock_write"]})
    res.update(gather_bandwidth())
    res.update(small_gather())
    res["seqlock_over_lock"] = res["seqlock_obs_per_s"] / res["lock_obs_per_s"]
    res["seqlock_over_lock_all"] = ((res["seqlock_obs_per_s"] + res["seqlock_write_obs_per_s"])
                                    / (res["lock_obs_per_s"] + res["lock_write_obs_per_s"]))
    res["gather_over_memcpy"] = res["gather_gbps"] / res["memcpy_gbps"]
    res["native_over_npstack"] = res["native_obs_per_s"] / res["npstack_obs_per_s"]
    res["cpus"] = os.cpu_count()
    res["bench_s"] = time.perf_counter() - t0
    res["load1_end"] = round(os.getloadavg()[0], 2)

    targets = {"torn_accepted": res["torn_accepted"] == 0 and res["reads"] >= 1_000_000,
               "seqlock_over_lock": res["seqlock_over_lock"] >= 4,
               "gather_over_memcpy": res["gather_over_memcpy"] >= 0.6,
               "native_over_npstack": res["native_over_npstack"] >= 8}
    res["targets_met"] = targets
    width = max(map(len, res))
    for k, v in res.items():
        if isinstance(v, float):
            v = f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        print(f"{k:<{width}}  {v}")
    if args.json:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
