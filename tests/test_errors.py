"""The error log (worker -> aggregator, in shared memory), the stack-trace hash, and the
Top-10 report.

Cross-process tests run the producer in spawned processes on a real /dev/shm segment. Every
record checks itself: it carries the md5 of its random body, so a reader can tell a torn or
overwritten record from a whole one. Child processes are spawned, so this module's top level
imports only what a child needs.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from rlpipe.shm.errorlog import (
    ERROR_LOG_BYTES,
    MAX_RECORD_BYTES,
    ErrorLog,
    encode_record,
    error_record,
    format_exc_text,
    stacktrace_hash,
)
from rlpipe.shm.segment import Segment, new_run_id, segment_name

CTX = mp.get_context("spawn")
LOG_OFF = 4096  # where the error log sits in the test segment (64-byte aligned)


def log_buffer(nbytes: int = ERROR_LOG_BYTES) -> np.ndarray:
    """A 64-byte aligned zeroed uint8 buffer (as a segment gives)."""
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + nbytes]


def body_record(writer: int, seq: int, size: int, rng) -> dict:
    body = rng.randbytes(size // 2).hex() if hasattr(rng, "randbytes") else os.urandom(size // 2).hex()
    return {"w": writer, "seq": seq, "body": body, "md5": hashlib.md5(body.encode()).hexdigest()}


def intact(rec: dict) -> bool:
    return hashlib.md5(rec["body"].encode()).hexdigest() == rec["md5"]


# --- child processes ----------------------------------------------------------------------


def producer_main(name: str, writer: int, n: int, max_size: int, progress, q) -> None:
    """Attach the error log in segment `name` and write n self-checking records (seq 0..n-1),
    retrying a refused record (log full) until it goes in. Runs until killed when n < 0."""
    seg = Segment.attach(name)
    elog = ErrorLog(np.frombuffer(seg.buf, dtype=np.uint8, count=ERROR_LOG_BYTES, offset=LOG_OFF), create=False)
    rng = random.Random(writer)
    refused = seq = 0
    while n < 0 or seq < n:
        rec = body_record(writer, seq, rng.randrange(16, max_size), rng)
        while not elog.write(rec):
            refused += 1
            time.sleep(0.0005)
        seq += 1
        progress.value = seq
    q.put({"refused": refused, "written": seq})


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def shm_log():
    """A real /dev/shm segment with an error log at LOG_OFF, created by the consumer side."""
    seg = Segment.create(segment_name(new_run_id(), "errlog"), LOG_OFF + ERROR_LOG_BYTES)
    elogs = []
    try:
        view = np.frombuffer(seg.buf, dtype=np.uint8, count=ERROR_LOG_BYTES, offset=LOG_OFF)
        elog = ErrorLog(view, create=True)
        elogs.append(elog)
        yield seg, elog
    finally:
        for r in elogs:
            r.release()
        seg.unlink()
        seg.close()


def reap(proc) -> None:
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


# --- the error log in one process----------------------------------------------------------


def test_round_trip_and_counters():
    buf = log_buffer()
    producer = ErrorLog(buf, create=True)
    consumer = ErrorLog(buf, create=False)
    recs = [{"seq": i, "env_id": np.int64(i), "msg": 'é ünïcode \n\t "quoted"', "x": [1.5, None]} for i in range(5)]
    assert all(producer.write(r) for r in recs)
    assert consumer.written == 5 and consumer.dropped == 0 and consumer.pending_bytes() > 0
    got = consumer.read_all()
    assert [g["seq"] for g in got] == list(range(5))
    assert got[0]["env_id"] == 0 and got[0]["msg"] == recs[0]["msg"] and got[0]["x"] == [1.5, None]
    assert consumer.read_all() == [] and consumer.pending_bytes() == 0 and consumer.corrupt == 0
    # compact JSON on the wire
    assert b", " not in encode_record({"a": 1, "b": [1, 2]})


def test_attach_to_uninitialised_memory_is_refused():
    with pytest.raises(ValueError, match="magic"):
        ErrorLog(log_buffer(), create=False)


def test_wraparound_over_many_records():
    buf = log_buffer()
    producer, consumer = ErrorLog(buf, create=True), ErrorLog(buf, create=False)
    rng = random.Random(1)
    got, total_bytes, seq = [], 0, 0
    while total_bytes < 3 * ERROR_LOG_BYTES:
        for _ in range(rng.randrange(1, 60)):
            rec = body_record(0, seq, rng.randrange(16, 6000), rng)
            assert producer.write(rec)
            total_bytes += len(rec["body"])
            seq += 1
        got += consumer.read_all()
    got += consumer.read_all()
    assert [g["seq"] for g in got] == list(range(seq))
    assert all(intact(g) for g in got)
    assert consumer.dropped == 0 and consumer.corrupt == 0
    head = int(np.frombuffer(buf, dtype=np.uint64, count=16)[8])
    assert head > 3 * producer.capacity  # the data area wrapped at least 3 times


def test_full_log_drops_and_counts_without_corrupting():
    buf = log_buffer()
    producer, consumer = ErrorLog(buf, create=True), ErrorLog(buf, create=False)
    rng = random.Random(2)
    accepted, used, seq = [], 0, 0
    while True:
        rec = body_record(0, seq, 3000, rng)
        seq += 1
        if not producer.write(rec):
            break
        accepted.append(rec["seq"])
        used += 8 + len(encode_record(rec))
    refused = 1 + sum(not producer.write(body_record(0, 10**6 + i, 3000, rng)) for i in range(5))
    assert refused == 6 and consumer.dropped == 6
    assert consumer.written == len(accepted)
    assert used > producer.capacity - 3200  # it filled the elog, not less
    got = consumer.read_all()
    assert [g["seq"] for g in got] == accepted and all(intact(g) for g in got)
    assert consumer.corrupt == 0
    assert producer.write(body_record(0, 7, 3000, rng))  # room again after the read
    assert [g["seq"] for g in consumer.read_all()] == [7]
    assert consumer.dropped == 6


def test_oversized_record_is_trimmed_to_the_cap():
    tb = (
        "Traceback (most recent call last):\n"
        + "".join(f'  File "/x/mod{i}.py", line {i}, in f{i}\n    call_{i}()\n' for i in range(6000))
        + "ValueError: the real cause\n"
    )
    rec = {
        "ts": 1.0,
        "env_id": 3,
        "env_type": "pong",
        "error_type": "ValueError",
        "stacktrace_hash": "ab" * 16,
        "message": "m" * 200,
        "traceback": tb,
    }
    assert len(json.dumps(rec)) > 10 * MAX_RECORD_BYTES
    buf = log_buffer()
    producer, consumer = ErrorLog(buf, create=True), ErrorLog(buf, create=False)
    assert producer.write(rec)
    (got,) = consumer.read_all()
    assert len(encode_record(rec)) <= MAX_RECORD_BYTES
    assert got["truncated"] is True and got["message"] == rec["message"]
    assert got["stacktrace_hash"] == rec["stacktrace_hash"] and got["env_id"] == 3
    assert got["traceback"].startswith("Traceback (most recent call last):\n")
    assert got["traceback"].endswith("ValueError: the real cause\n")
    assert "chars trimmed" in got["traceback"] and len(got["traceback"]) > MAX_RECORD_BYTES // 2

    # escape-heavy strings (6 bytes each in JSON), a huge message, many fields: still fits
    ugly = {
        "message": "\x01" * 100_000,
        "traceback": "\u2603" * 50_000,
        "extra": {"k": "z" * 100_000},
        "stacktrace_hash": "cd" * 16,
        "env_id": 9,
    }
    for r in (ugly, {"a": "b" * 10**6}):
        payload = encode_record(r)
        assert len(payload) <= MAX_RECORD_BYTES and json.loads(payload)["truncated"] is True
        assert producer.write(r)
    back = consumer.read_all()
    assert back[0]["stacktrace_hash"] == "cd" * 16 and back[0]["env_id"] == 9
    assert consumer.corrupt == 0


def test_torn_unpublished_record_is_never_read_and_is_overwritten():
    """A writer killed between writing a record's bytes and publishing head (simulated)."""
    buf = log_buffer()
    producer, consumer = ErrorLog(buf, create=True), ErrorLog(buf, create=False)
    assert producer.write({"seq": 0})
    head = producer._head
    data = buf[256:]
    data[head : head + 8] = np.frombuffer(np.array([200, 12345], dtype="<u4").tobytes(), np.uint8)
    data[head + 8 : head + 40] = np.frombuffer(b'{"seq": 1, "half": "writ' + b"\xff" * 8, np.uint8)
    assert [r["seq"] for r in consumer.read_all()] == [0]
    assert consumer.read_all() == []
    successor = ErrorLog(buf, create=False)  # the next writer continues from head
    assert successor.write({"seq": 2, "body": "x" * 500})
    assert [r["seq"] for r in consumer.read_all()] == [2] and consumer.corrupt == 0


def test_threads_of_one_producer_do_not_interleave():
    buf = log_buffer()
    producer, consumer = ErrorLog(buf, create=True), ErrorLog(buf, create=False)
    got = []

    def write(w):
        rng = random.Random(w)
        for i in range(400):
            while not producer.write(body_record(w, i, rng.randrange(16, 3000), rng)):
                time.sleep(0.0005)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        got += consumer.read_all()
    got += consumer.read_all()
    assert all(intact(g) for g in got) and len(got) == 1600 and consumer.corrupt == 0
    for w in range(4):
        assert [g["seq"] for g in got if g["w"] == w] == list(range(400))


# --- the error log across processes--------------------------------------------------------


def test_cross_process_producer_concurrent_consumer(shm_log):
    seg, elog = shm_log
    n = 4000
    progress, q = CTX.RawValue("q", 0), CTX.Queue()
    proc = CTX.Process(target=producer_main, args=(seg.name, 1, n, 8000, progress, q), name="errprod")
    proc.start()
    got, deadline = [], time.monotonic() + 30
    try:
        while elog.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.001)  # no reader at first: the log fills, records are refused
        while len(got) < n and time.monotonic() < deadline:
            got += elog.read_all()
        result = q.get(timeout=10)
    finally:
        reap(proc)
    assert proc.exitcode == 0
    assert [g["seq"] for g in got] == list(range(n))
    assert all(g["w"] == 1 and intact(g) for g in got)
    assert elog.corrupt == 0 and elog.written == n
    assert elog.dropped == result["refused"] > 0


def test_producer_sigkilled_mid_writing_leaves_the_log_readable(shm_log):
    seg, elog = shm_log
    rng = random.Random(3)
    got, kills = [], 0
    for writer in range(1, 7):  # each successor attaches and goes on from head
        progress, q = CTX.RawValue("q", 0), CTX.Queue()
        proc = CTX.Process(
            target=producer_main, args=(seg.name, writer, -1, 16000, progress, q), name=f"errprod{writer}"
        )
        proc.start()
        try:
            deadline = time.monotonic() + 20
            while progress.value < 5 and time.monotonic() < deadline:
                got += elog.read_all()
            t_kill = time.monotonic() + rng.uniform(0.01, 0.08)
            while time.monotonic() < t_kill:
                got += elog.read_all()
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
            proc.join(10)
            assert proc.exitcode == -signal.SIGKILL
        finally:
            reap(proc)
        got += elog.read_all()
    got += elog.read_all()
    assert kills == 6 and elog.corrupt == 0
    assert all(intact(g) for g in got)
    for writer in range(1, 7):
        seqs = [g["seq"] for g in got if g["w"] == writer]
        assert len(seqs) >= 5 and seqs == list(range(len(seqs))), writer
    # the error log still works
    writer_ring = ErrorLog(np.frombuffer(seg.buf, dtype=np.uint8, count=ERROR_LOG_BYTES, offset=LOG_OFF), create=False)
    assert writer_ring.write({"after": True})
    assert elog.read_all() == [{"after": True}]
    writer_ring.release()


# --- the stack-trace hash and the record ---------------------------------------------------


class Widget:
    pass


def crash_at(blank_lines: int, path: str, func: str = "step", exc: str = "ValueError", extra_frame: bool = False):
    """Raise the same bug from source that sits at another line (and another install path)."""
    src = "\n" * blank_lines + (
        "def inner(obj, n):\n"
        f"    raise {exc}(f'bad action {{n}} for {{obj!r}} at step {{n * 7}}')\n"
        f"def {func}(obj, n):\n"
        "    return inner(obj, n)\n"
    )
    if extra_frame:
        src += f"def outer(obj, n):\n    return {func}(obj, n)\n"
    ns = {}
    exec(compile(src, path, "exec"), ns)
    try:
        (ns["outer"] if extra_frame else ns[func])(Widget(), random.randrange(10**6))
    except Exception as e:
        return e
    raise AssertionError("did not raise")


def test_stacktrace_hash_is_stable_for_one_bug_and_differs_between_bugs():
    a = crash_at(0, "/work/main/rlpipe/envs/custom.py")
    b = crash_at(37, "/home/u/other-checkout/rlpipe/envs/custom.py")  # lines, paths, ids
    c = crash_at(3, "/opt/venv/lib/python3.11/site-packages/rlpipe/envs/custom.py")
    assert "0x" in str(a) and str(a) != str(b)
    assert stacktrace_hash(a) == stacktrace_hash(b)
    assert stacktrace_hash(a) == stacktrace_hash(format_exc_text(a))
    assert stacktrace_hash(c) == stacktrace_hash(
        crash_at(9, "/srv/x/lib/python3.12/site-packages/rlpipe/envs/custom.py")
    )
    different = [
        crash_at(0, "/work/main/rlpipe/envs/custom.py", func="reset"),  # function
        crash_at(0, "/work/main/rlpipe/envs/custom.py", exc="KeyError"),  # type
        crash_at(0, "/work/main/rlpipe/envs/custom.py", extra_frame=True),  # path
        crash_at(0, "/work/main/rlpipe/envs/bullet.py"),
    ]  # file
    hashes = {stacktrace_hash(a)} | {stacktrace_hash(e) for e in different}
    assert len(hashes) == 5
    assert all(len(h) == 32 and int(h, 16) >= 0 for h in hashes)


def test_error_record_fields():
    exc = crash_at(5, "/work/main/rlpipe/envs/custom.py")
    rec = error_record(np.int64(42), "cartpole", exc, ts=123.4567)
    assert rec["ts"] == 123.457 and rec["env_id"] == 42 and rec["env_type"] == "cartpole"
    assert rec["error_type"] == "ValueError" and rec["level"] == "ERROR"
    assert rec["stacktrace_hash"] == stacktrace_hash(exc)
    assert rec["message"].startswith("bad action") and "\n" not in rec["message"]
    assert rec["traceback"].startswith("Traceback") and "custom.py" in rec["traceback"]
    assert json.loads(encode_record(rec)) == rec
    try:
        raise RuntimeError("first line\nsecond line " + "y" * 5000)
    except RuntimeError as e:
        long_rec = error_record(None, None, e)
    assert long_rec["message"] == "first line" and long_rec["env_id"] is None


# --- the aggregator -----------------------------------------------------------------------


def fake_record(k: int, env_id: int, env_type: str, ts: float) -> dict:
    return {
        "ts": ts,
        "level": "ERROR",
        "env_id": env_id,
        "env_type": env_type,
        "error_type": f"Error{k}",
        "stacktrace_hash": f"{k:032x}",
        "message": f"bug {k} | pipe",
        "traceback": f'Traceback (most recent call last):\n  File "m.py", line {k}, in f\nError{k}: bug {k}\n',
    }


def test_aggregator_top10_report(tmp_path):
    from rlpipe.supervisor.errors import ErrorAggregator

    agg = ErrorAggregator(tmp_path, interval_s=1.0)
    assert agg.maybe_run(now=0.0)
    text = (tmp_path / "errors_top10.md").read_text()
    assert "No errors were recorded." in text and "0 error record(s)" in text

    elogs = {w: ErrorLog(log_buffer(1 << 16), create=True) for w in ("w0", "w1")}
    for w, r in elogs.items():
        agg.add_log(w, ErrorLog(r._u8, create=False))
    # hash k occurs 13 - k times (k = 1..12), split over both workers and two env types
    ts = 1_700_000_000.0
    for k in range(1, 13):
        for i in range(13 - k):
            w = "w0" if i % 2 == 0 else "w1"
            assert elogs[w].write(
                fake_record(k, env_id=100 + i, env_type="pong" if i % 3 else "cartpole", ts=ts + k * 10 + i)
            )
    assert not agg.maybe_run(now=0.5)  # within the interval: nothing
    assert agg.maybe_run(now=1.0)
    counts = agg.counts_by_hash()
    assert counts == {f"{k:032x}": 13 - k for k in range(1, 13)}
    text = (tmp_path / "errors_top10.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 10
    assert [int(r.split("|")[3]) for r in rows] == list(range(12, 2, -1))  # by count
    assert f"`{1:032x}`" in rows[0] and "Error1" in rows[0] and "pong ×8, cartpole ×4" in rows[0]
    assert "2023-11-14 22:13:30" in rows[0] and "2023-11-14 22:13:41" in rows[0]  # first / last seen
    assert "78 error record(s), 12 distinct stack trace(s), 0 dropped" in text
    assert "2 more stack trace(s) outside the top 10: 3 record(s)." in text
    assert text.count("```text") == 10 and "Error1: bug 1" in text and "Error12: bug" not in text
    assert "Message: `bug 1 | pipe`" in text
    tb_text = agg.text_for_tensorboard()
    assert "| 1 |" in tb_text and "Error1: bug 1" in tb_text

    # a replaced worker: its last records are drained on removal; its drops still count
    assert elogs["w1"].write(fake_record(1, 7, "pong", ts + 500))
    for _ in range(10_000):
        if not elogs["w1"].write(fake_record(2, 8, "pong", ts + 600)):
            break
    assert agg.drain("w0") == 0
    pulled = agg.remove_log("w1")
    assert pulled > 1 and agg.counts_by_hash()[f"{1:032x}"] == 13
    assert agg.dropped == 1 and agg.remove_log("w1") == 0
    agg.add_log("w1", ErrorLog(ErrorLog(log_buffer(1 << 16), create=True)._u8, create=False))
    assert elogs["w0"].write(fake_record(12, 1, "pong", ts + 700))
    agg.add_log("w0", ErrorLog(log_buffer(1 << 16), create=True))  # replaces: drains the old
    assert agg.counts_by_hash()[f"{12:032x}"] == 2
    path = agg.finish()
    assert path == tmp_path / "errors_top10.md" and "1 dropped (error log full)" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors_top10.md"]  # no tmp left


def test_report_rewrite_is_atomic(tmp_path):
    from rlpipe.supervisor.errors import ErrorAggregator

    agg = ErrorAggregator(tmp_path, interval_s=0.0)
    elog = ErrorLog(log_buffer(1 << 18), create=True)
    agg.add_log(0, elog)
    agg.write_report()
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            seen.append((tmp_path / "errors_top10.md").read_text())

    t = threading.Thread(target=reader)
    t.start()
    written = set()
    try:
        for i in range(150):
            elog.write(fake_record(i % 15, i, "pong", 1e9 + i))
            agg.pull()
            written.add(agg.write_report().read_text())
    finally:
        stop.set()
        t.join()
    assert len(seen) > 10
    complete = [
        s
        for s in seen
        if s.startswith("# Errors")
        and s.endswith("\n")
        and ("No errors were recorded." in s or s.rstrip().endswith("```"))
    ]
    assert len(complete) == len(seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors_top10.md"]
