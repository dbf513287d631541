"""The obs board and its segments: torn reads, killed and replaced writers, alignment, hygiene.

Writers and readers run as separate (spawned) processes on a real /dev/shm segment. Every
published row checks itself (rlpipe.shm.payloads): a reader counts a row as torn when the
checksum fails or the keys of one env disagree, and as stale when an env's tag goes back.

Child processes are spawned, so this module's top level imports only what a child needs
(numpy, the native board, the segment module); the engine layout (and Hydra) is imported in
the parent only.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from rlpipe.native.board import BoardView, load_u64, store_u64
from rlpipe.shm.payloads import Payloads, check_rows
from rlpipe.shm.segment import SHM_DIR, Segment, new_run_id, run_segments, segment_name, sweep_dead_segments

H_GENERATION = 8  # rlpipe.shm.layout.H_GENERATION (checked in test_layout_constants)
CTX = mp.get_context("spawn")
REPO = Path(__file__).resolve().parent.parent


# --- boards for the child processes ---------------------------------------------------------


def open_board(geo):
    seg = Segment.attach(geo["name"])
    board = BoardView(
        seg.base,
        geo["ctrl_off"],
        geo["key_offsets"],
        geo["strides"],
        geo["row_bytes"],
        seg.base + H_GENERATION,
        locked=geo["locked"],
        n_envs=geo["n_envs"],
        keepalive=seg.buf,
    )
    if geo.get("stream"):
        board.stream_bytes = 0  # every row of 4 KiB and up in non-temporal stores
    if geo.get("lock_envs"):
        board.lock_envs = geo["lock_envs"]  # lock board: envs sharing one mutex
    return seg, board


def out_rows(geo, n=None):
    n = geo["n_envs"] if n is None else n
    outs = [np.zeros((n, rb // 8), dtype=np.uint64) for rb in geo["row_bytes"]]
    return outs, [o.ctypes.data for o in outs], [o.strides[0] for o in outs]


def wait_published(board, n_envs, min_seq=4, timeout=30.0):
    """Until every env has had both slots written (rows before that are zeros, not payloads)."""
    deadline = time.monotonic() + timeout
    while min(board.seq(e) for e in range(n_envs)) < min_seq:
        if time.monotonic() > deadline:
            raise TimeoutError("the writer never published")
        time.sleep(0.002)


# --- child processes ------------------------------------------------------------------------


def writer_main(geo, writer_id, gen, stop, q):
    seg, board = open_board(geo)
    n = geo["n_envs"]
    pay = Payloads(geo["row_bytes"], n, writer_id, seed=writer_id)
    k = ok = 0
    revoked = False
    while not stop.value:
        k += 1
        if board.publish(pay.fill(k), pay.strides, 0, n, gen) < 0:
            revoked = True
            break
        ok += 1
    q.put({"role": "writer", "writer_id": writer_id, "publishes": ok, "revoked": revoked})
    del board
    seg.close()


def reader_main(geo, writer_id, max_s, stop, q, unchecked_every=5):
    """Checked reads of all envs until stop/max_s; every `unchecked_every`-th read is the
    original system's unchecked double-buffer read (the negative control: it may tear)."""
    seg, board = open_board(geo)
    n = geo["n_envs"]
    outs, ptrs, strides = out_rows(geo)
    wait_published(board, n)
    last = np.zeros(n, dtype=np.uint64)
    stats = dict(role="reader", reads=0, torn=0, stale=0, foreign=0, retries=0, unchecked=0, torn_unchecked=0)
    t0 = time.monotonic()
    i = 0
    while not stop.value and time.monotonic() - t0 < max_s:
        i += 1
        if unchecked_every and i % unchecked_every == 0:
            board.gather_unchecked(ptrs, strides, 0, n)
            ok, _ = check_rows(outs)
            stats["unchecked"] += n
            stats["torn_unchecked"] += int(n - ok.sum())
            continue
        stats["retries"] += board.gather(ptrs, strides, 0, n)
        ok, tags = check_rows(outs)
        stats["reads"] += n
        stats["torn"] += int(n - ok.sum())
        stats["foreign"] += int(((tags >> np.uint64(56)) != writer_id)[ok].sum())
        good = np.where(ok, tags, last)
        stats["stale"] += int((good < last).sum())
        np.maximum(last, good, out=last)
    q.put(stats)
    del board
    seg.close()


def gather_after_kill_main(geo, q):
    """A fresh process reads (and, as a successor would, publishes) after the writer died."""
    seg, board = open_board(geo)
    outs, ptrs, strides = out_rows(geo)
    board.gather(ptrs, strides, 0, geo["n_envs"])
    ok, tags = check_rows(outs)
    seqs = [board.seq(e) for e in range(geo["n_envs"])]
    pay = Payloads(geo["row_bytes"], geo["n_envs"], writer_id=9, seed=9)
    republished = board.publish(pay.fill(1), pay.strides, 0, geo["n_envs"], load_u64(seg.base + H_GENERATION))
    board.gather(ptrs, strides, 0, geo["n_envs"])
    ok2, tags2 = check_rows(outs)
    q.put(
        {
            "ok": ok.tolist(),
            "tags": [int(t) for t in tags],
            "seqs": seqs,
            "republished": republished,
            "ok2": ok2.tolist(),
            "tags2": [int(t) for t in tags2],
        }
    )
    del board
    seg.close()


def owner_main(q, hold):
    """A stand-in driver: creates two segments of its run, reports, then lives `hold` s."""
    run_id = new_run_id()
    segs = [Segment.create(segment_name(run_id, part), 4096) for part in ("w0g1", "w1g1")]
    q.put(run_id)
    time.sleep(hold)
    for s in segs:
        s.close()


# --- parent-side helpers --------------------------------------------------------------------


@pytest.fixture
def segments():
    """Create board segments for a test; every one is unlinked afterwards, and checked gone."""
    made = []

    def make(buffer_keys, n_envs, locked=False, gen=1):
        from rlpipe.shm.layout import H_GENERATION as H_GEN, WorkerLayout, WorkerViews

        assert H_GEN == H_GENERATION
        layout = WorkerLayout.build(n_envs, tuple(buffer_keys), 0)
        seg = Segment.create(segment_name(new_run_id(), f"t{len(made)}"), layout.size)
        made.append(seg)
        views = WorkerViews(layout, seg, locked=locked)
        views.store(H_GENERATION, gen)
        if locked:
            views.board.init_locks(n_envs)
        views.release()
        return seg, dict(
            name=seg.name,
            ctrl_off=layout.ctrl_off,
            key_offsets=list(layout.key_offsets),
            strides=list(layout.strides),
            row_bytes=[k.nbytes for k in buffer_keys],
            n_envs=n_envs,
            locked=locked,
        )

    yield make
    for seg in made:
        seg.unlink()
        seg.close()
        assert not (SHM_DIR / seg.name).exists()


def buffer_keys(option: str, rgb_dtype: str | None = None):
    """Obs keys of conf/buffer/<option>.yaml, composed through Hydra like a real run."""
    from conftest import compose_cfg
    from rlpipe.config import run_spec

    overrides = [f"buffer={option}"]
    if rgb_dtype:
        overrides.append(f"buffer.keys.rgb.dtype={rgb_dtype}")
    return run_spec(compose_cfg(overrides)).obs_keys


def buffer_options():
    # at collection (spawned children import this module too): no Hydra import here
    for path in sorted((REPO / "conf" / "buffer").glob("*.yaml")):
        has_rgb = "rgb:" in path.read_text()
        for dtype in ("uint8", "float32") if has_rgb else (None,):
            yield path.stem, dtype


def stop_mid_write(proc, board, n_envs, want, tries=2000):
    """SIGSTOP `proc` until `want(board, env)` holds for some env (it is inside a publish);
    returns that env, the process left stopped."""
    rng = np.random.default_rng(0)
    for _ in range(tries):
        os.kill(proc.pid, signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)
        for e in range(n_envs):
            if want(board, e):
                return e
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(rng.uniform(0, 0.002))
    raise AssertionError("never caught the writer inside a publish")


def reap(*procs, timeout=20.0):
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            raise AssertionError(f"{p.name} did not finish")


# --- layout and alignment -------------------------------------------------------------------


def test_layout_constants():
    from rlpipe.shm import layout

    assert layout.H_GENERATION == H_GENERATION and layout.CTRL_BYTES == 64


@pytest.mark.parametrize("option,rgb_dtype", list(buffer_options()))
def test_every_slot_is_64_byte_aligned(segments, option, rgb_dtype):
    from rlpipe.shm.layout import WorkerLayout

    keys = buffer_keys(option, rgb_dtype)
    if rgb_dtype:
        assert dict((k.name, k.dtype) for k in keys)["rgb"] == rgb_dtype
    for n_envs in (1, 3, 70):
        seg, geo = segments(keys, n_envs)
        layout = WorkerLayout.build(n_envs, tuple(keys), 0)
        _, board = open_board(geo)
        assert seg.base % 4096 == 0 and (seg.base + layout.ctrl_off) % 64 == 0
        for k, key in enumerate(keys):
            assert layout.strides[k] % 64 == 0 and layout.strides[k] >= key.nbytes
            for e in range(n_envs):
                for slot in (0, 1):
                    assert board.slot_address(k, e, slot) % 64 == 0, (key, e, slot)
            end = board.slot_address(k, n_envs - 1, 1) + layout.strides[k]
            assert end - seg.base <= layout.size
        del board


def test_board_rejects_misaligned_geometry(segments):
    from rlpipe.config import ObsKey

    seg, geo = segments([ObsKey("state", (32,), "float32")], 4)
    with pytest.raises(ValueError):
        BoardView(
            seg.base,
            geo["ctrl_off"],
            [geo["key_offsets"][0] + 8],
            geo["strides"],
            geo["row_bytes"],
            seg.base + H_GENERATION,
        )
    with pytest.raises(ValueError):
        BoardView(seg.base, geo["ctrl_off"], geo["key_offsets"], [136], [132], seg.base + H_GENERATION)


# --- single-process semantics -----------------------------------------------------------------


@pytest.mark.parametrize(
    "locked,stream,lock_envs",
    [(False, False, 0), (False, True, 0), (True, False, 0), (True, True, 0), (True, False, 3)],
    ids=["seqlock", "seqlock-streamed", "lock", "lock-streamed", "lock-per-3-envs"],
)
def test_publish_gather_idx_and_revocation(segments, locked, stream, lock_envs):
    keys = buffer_keys("small")
    n = 8
    seg, geo = segments(keys, n, locked=locked)
    _, board = open_board(dict(geo, stream=stream, lock_envs=lock_envs))
    pay = Payloads(geo["row_bytes"], n, writer_id=3, seed=3)
    for k in (1, 2, 3):
        assert board.publish(pay.fill(k), pay.strides, 0, n, 1) == n
    assert [board.seq(e) for e in range(n)] == [6] * n

    outs, ptrs, strides = out_rows(geo)
    assert board.gather(ptrs, strides, 0, n) == 0
    ok, tags = check_rows(outs)
    assert ok.all() and (tags == ((3 << 56) | 3)).all()

    # a list of env ids (with repeats), as numpy int64, into fewer rows than the board
    idx = np.array([5, 1, 1, 7], dtype=np.int64)
    outs4, ptrs4, strides4 = out_rows(geo, 4)
    board.gather(ptrs4, strides4, 0, 4, idx)
    assert all(np.array_equal(o4, o[idx]) for o4, o in zip(outs4, outs))
    with pytest.raises(IndexError):
        board.gather(ptrs4, strides4, 0, 4, np.array([0, 1, 2, n], dtype=np.int64))
    with pytest.raises(IndexError):
        board.gather(ptrs4, strides4, n - 2, 4)
    with pytest.raises(ValueError):
        board.gather(ptrs4, strides4, 0, 4, np.array([0, 1], dtype=np.int64))
    with pytest.raises(IndexError):
        board.publish(pay.fill(4), pay.strides, 1, n, 1)

    # into a torch tensor's memory
    torch = pytest.importorskip("torch")
    t = torch.zeros((4, geo["row_bytes"][1] // 4), dtype=torch.float32)
    board.gather([ptrs4[0], t.data_ptr(), ptrs4[2]], [strides4[0], t.stride(0) * 4, strides4[2]], 0, 4, idx)
    assert np.array_equal(t.numpy().view(np.uint64), outs[1][idx])

    # revoked: the next publish fails and nothing moves
    store_u64(seg.base + H_GENERATION, 2)
    assert board.publish(pay.fill(4), pay.strides, 0, n, 1) == -1
    assert [board.seq(e) for e in range(n)] == [6] * n
    board.gather(ptrs, strides, 0, n)
    assert (check_rows(outs)[1] == ((3 << 56) | 3)).all()
    assert board.publish(pay.fill(4), pay.strides, 0, n, 2) == n
    del board


# --- concurrency: lapping, killing, replacing ---------------------------------------------------


@pytest.mark.parametrize(
    "rgb_dtype,locked,stream,lock_envs",
    [("uint8", False, False, 0), ("float32", False, True, 0), ("uint8", True, False, 0), ("float32", True, True, 2)],
    ids=["rgb-uint8", "rgb-float32-streamed", "rgb-uint8-lockboard", "rgb-float32-streamed-lockboard-one-mutex"],
)
def test_writer_laps_two_readers_no_torn_read_accepted(segments, rgb_dtype, locked, stream, lock_envs):
    keys = buffer_keys("seed", rgb_dtype)
    assert [k.name for k in keys] == ["rgb", "state", "vector"]
    n = 2
    seg, geo = segments(keys, n, locked=locked)
    geo["stream"] = stream  # float32 rows (600 KB) as a big batch would copy them
    geo["lock_envs"] = lock_envs
    stop, q = CTX.RawValue("i", 0), CTX.Queue()
    writer = CTX.Process(target=writer_main, args=(geo, 1, 1, stop, q), name="writer")
    readers = [
        CTX.Process(target=reader_main, args=(geo, 1, 1.5, stop, q, 0 if locked else 2), name=f"reader{i}")
        for i in range(2)
    ]
    writer.start()
    for r in readers:
        r.start()
    try:
        stats = [q.get(timeout=60) for _ in readers]
    finally:
        stop.value = 1
    w = q.get(timeout=30)
    reap(writer, *readers)
    for s in stats:
        assert s["reads"] > 100, s
        assert s["torn"] == 0 and s["stale"] == 0 and s["foreign"] == 0, s
    assert w["publishes"] > 100
    if not locked:
        # The stress is real: the writer lapped the readers (the seqlock retried) and the
        # original system's unchecked read, run side by side, did return torn rows.
        assert sum(s["retries"] for s in stats) > 0, stats
        assert sum(s["torn_unchecked"] for s in stats) > 0, stats


@pytest.mark.parametrize("locked", [False, True], ids=["seqlock", "lock"])
def test_writer_killed_mid_write_leaves_old_row_readable(segments, locked):
    keys = buffer_keys("seed", "float32")
    n = 2
    seg, geo = segments(keys, n, locked=locked)

    def lock_owner(env: int) -> int:
        """The owner tid bits of env's lock word, the 4 low bytes of a little-endian load."""
        return load_u64(seg.base + geo["ctrl_off"] + env * 64 + 8) & 0x3FFFFFFF

    stop, q = CTX.RawValue("i", 0), CTX.Queue()
    writer = CTX.Process(target=writer_main, args=(geo, 1, 1, stop, q), name="writer")
    writer.start()
    try:
        _, board = open_board(geo)
        wait_published(board, n)
        if locked:  # holding the env's robust mutex (glibc: owner tid in the lock word at +8)
            env = stop_mid_write(writer, board, n, lambda b, e: lock_owner(e) == writer.pid)
        else:  # sequence odd: between the odd store and the publishing store
            env = stop_mid_write(writer, board, n, lambda b, e: b.seq(e) % 2 == 1)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(10)
        assert writer.exitcode == -signal.SIGKILL
        seqs = [board.seq(e) for e in range(n)]
        if not locked:
            assert seqs[env] % 2 == 1
        del board

        # Read from a fresh process (a dead lock holder must not hang it), which then
        # publishes as a successor would.
        reader = CTX.Process(target=gather_after_kill_main, args=(geo, q), name="reader")
        reader.start()
        got = q.get(timeout=30)
        reap(reader)
    finally:
        if writer.is_alive():
            writer.kill()
    assert all(got["ok"]), got
    # exactly the last completed publish of each env: publish k leaves seq 2k
    assert got["tags"] == [(1 << 56) | (s // 2) for s in seqs]
    assert got["seqs"] == seqs
    assert got["republished"] == n and all(got["ok2"]) and got["tags2"] == [(9 << 56) | 1] * n


def test_stopped_writer_replaced_then_continued_cannot_publish(segments):
    keys = buffer_keys("seed", "uint8")
    n = 4
    seg1, geo1 = segments(keys, n, gen=1)
    stop, q = CTX.RawValue("i", 0), CTX.Queue()
    stale = CTX.Process(target=writer_main, args=(geo1, 1, 1, stop, q), name="stale-writer")
    stale.start()
    procs = [stale]
    try:
        _, board1 = open_board(geo1)
        wait_published(board1, n)
        env = stop_mid_write(stale, board1, n, lambda b, e: b.seq(e) % 2 == 1)
        seqs_at_stop = [board1.seq(e) for e in range(n)]

        # The driver replaces it: revoke generation 1, fresh segment for generation 2.
        store_u64(seg1.base + H_GENERATION, 2)
        seg2, geo2 = segments(keys, n, gen=2)
        successor = CTX.Process(target=writer_main, args=(geo2, 2, 2, stop, q), name="successor")
        readers = [
            CTX.Process(target=reader_main, args=(geo2, 2, 1.5, stop, q, 0), name=f"reader{i}") for i in range(2)
        ]
        procs += [successor, *readers]
        successor.start()
        for r in readers:
            r.start()
        _, board2 = open_board(geo2)
        wait_published(board2, n)
        os.kill(stale.pid, signal.SIGCONT)  # the stale writer wakes up mid-copy
        reports = [q.get(timeout=60) for _ in range(3)]  # the stale writer and both readers
        stop.value = 1
        reports.append(q.get(timeout=30))
        reap(*procs)
    finally:
        stop.value = 1
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    by_writer = {r["writer_id"]: r for r in reports if r["role"] == "writer"}
    readers_stats = [r for r in reports if r["role"] == "reader"]
    # The stale writer's in-flight publish was refused (checked after its copy) and it stopped.
    assert by_writer[1]["revoked"] is True
    assert [board1.seq(e) for e in range(n)] == seqs_at_stop and seqs_at_stop[env] % 2 == 1
    # Its old segment still serves its last whole rows, the cut-off one included.
    outs, ptrs, strides = out_rows(geo1)
    board1.gather(ptrs, strides, 0, n)
    ok, tags = check_rows(outs)
    assert ok.all() and tags.tolist() == [(1 << 56) | (s // 2) for s in seqs_at_stop]
    # The learner reads generation 2 only: whole rows, all from the successor, never back in time.
    assert by_writer[2]["revoked"] is False and by_writer[2]["publishes"] > 0
    for s in readers_stats:
        assert s["reads"] > 0 and s["torn"] == 0 and s["stale"] == 0 and s["foreign"] == 0, s
    del board1, board2


# --- segment hygiene --------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o277])
def test_segment_mode_is_0600_whatever_the_umask(umask):
    old = os.umask(umask)
    try:
        seg = Segment.create(segment_name(new_run_id(), "mode"), 4096)
    finally:
        os.umask(old)
    try:
        st = os.stat(SHM_DIR / seg.name)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
        assert seg.name.startswith(f"rlpipe_{os.getpid()}-")
    finally:
        seg.unlink()
        seg.close()


def test_sweep_removes_dead_owners_segments_and_keeps_live_ones():
    q = CTX.Queue()
    dead = CTX.Process(target=owner_main, args=(q, 60), name="killed-driver")
    live = CTX.Process(target=owner_main, args=(q, 60), name="live-driver")
    dead.start()
    dead_run = q.get(timeout=30)
    live.start()
    live_run = q.get(timeout=30)
    mine = Segment.create(segment_name(new_run_id(), "w0g1"), 4096)
    try:
        assert len(run_segments(dead_run)) == 2 and len(run_segments(live_run)) == 2
        os.kill(dead.pid, signal.SIGKILL)  # kill -9 of a driver: no cleanup ran
        # not reaped yet: a zombie is dead too. Looked at closely: from its death any run's
        # sweep may take the dead owner's segments, and a test run may go on beside (xdist).
        deadline = time.monotonic() + 10
        while Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert len(run_segments(dead_run)) == 2
        removed = sweep_dead_segments()  # what the next run does first
        dead.join(10)
        assert set(run_segments(dead_run)).isdisjoint(run_segments(live_run))
        assert run_segments(dead_run) == []
        assert {segment_name(dead_run, "w0g1"), segment_name(dead_run, "w1g1")} <= set(removed)
        assert len(run_segments(live_run)) == 2 and (SHM_DIR / mine.name).exists()
    finally:
        for p in (dead, live):
            if p.is_alive():
                p.kill()
            p.join(10)
        sweep_dead_segments()
        mine.unlink()
        mine.close()
    assert run_segments(live_run) == [] and run_segments(dead_run) == []


RT_SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, sys
    from rlpipe.shm.segment import Segment, new_run_id, segment_name

    def child(name):
        seg = Segment.attach(name)
        seg.buf[0] = 42
        seg.close()

    if __name__ == "__main__":
        seg = Segment.create(segment_name(new_run_id(), "rt"), 1 << 16)
        for method in ("spawn", "forkserver", "fork"):
            p = mp.get_context(method).Process(target=child, args=(seg.name,))
            p.start(); p.join()
            assert p.exitcode == 0
        assert seg.buf[0] == 42
        seg.close()                      # detach without unlinking: the name must survive
        print(seg.name)
""")


def test_attach_detach_leaves_no_resource_tracker_trace(tmp_path):
    script = tmp_path / "rt.py"
    script.write_text(RT_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    name = out.stdout.strip()
    try:
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""  # no resource_tracker warning, nothing
        assert (SHM_DIR / name).exists()  # and nobody unlinked it behind our back
    finally:
        if name.startswith("rlpipe_"):
            (SHM_DIR / name).unlink(missing_ok=True)


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A real 1 MiB tmpfs standing in for /dev/shm (root only: mount)."""
    import rlpipe.shm.segment as segment

    mnt = tmp_path / "shm"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    monkeypatch.setattr(segment, "SHM_DIR", mnt)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_segment_is_allocated_whole_and_a_full_shm_is_a_clear_error(small_shm):
    """Every page of a segment exists from its creation (its /dev/shm bytes are its size, not
    what has been written so far), and a segment /dev/shm cannot hold is a SharedMemoryFull
    (a ConfigError: exit 2) naming the directory and the bytes, with nothing left behind."""
    from rlpipe.shm.segment import SharedMemoryFull
    from rlpipe.spec import ConfigError

    seg = Segment.create("rlpipe_1-abc_w0g1", 256 * 1024)
    assert (small_shm / seg.name).stat().st_blocks * 512 >= 256 * 1024  # allocated, not sparse
    seg.close()
    with pytest.raises(
        SharedMemoryFull, match=r"cannot hold the shared-memory segment rlpipe_1-abc_w1g1 \(4\.0 MiB"
    ) as exc:
        Segment.create("rlpipe_1-abc_w1g1", 4 * 2**20)
    assert isinstance(exc.value, ConfigError) and str(small_shm) in str(exc.value)
    assert sorted(p.name for p in small_shm.iterdir()) == ["rlpipe_1-abc_w0g1"]  # the failed one is gone
