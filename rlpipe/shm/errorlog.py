"""A worker's error log: single-producer / single-consumer JSON records in shared memory.

The worker (producer) writes one compact JSON record per ERROR; the driver's aggregator
(consumer) pulls them every `logging.aggregate_interval_s`. The log is a fixed byte region
(1 MiB, 64-byte aligned) of the worker's segment:

    +0     magic u64          written last by the creator (release)
    +8     capacity u64       bytes in the data area (a multiple of 8)
    +16    max record u64     the payload cap the creator chose (informational)
    +64    head u64           producer: bytes ever written (monotonic)        own cache line
    +72    dropped u64        producer: records refused because the log was full
    +80    written u64        producer: records accepted
    +128   tail u64           consumer: bytes ever consumed (monotonic)       own cache line
    +256   data               capacity bytes

Records are 8-byte aligned: `u32 length | u32 crc32(payload) | payload | pad`. A record never
straddles the end of the data area: when it does not fit before the end, the producer writes
a skip marker (length 0xFFFFFFFF) there and starts the record at offset 0; the skipped bytes
count as used. head and tail are positions in an unbounded byte stream (offset = pos %
capacity), so `head - tail` is the number of unread bytes and the log is empty iff they are
equal.

Ordering: the producer writes the record's bytes, then release-stores the new head
(`rlpipe.native.board.store_u64`); the consumer acquire-loads head, copies the records out,
then release-stores tail; the producer acquire-loads tail before deciding there is room. So
the consumer never reads bytes that are not yet published, and the producer never overwrites
bytes the consumer has not released. A producer killed mid-record leaves head at the last
whole record: the half-written bytes lie beyond head and are overwritten by the next writer
(a successor attaching with `create=False` continues from the published head).

Full log: the record is dropped and `dropped` counts it; the producer never blocks and
never overwrites unread data. An oversized record is shrunk to fit the cap (the traceback is
trimmed in the middle, keeping its start and the innermost frames + exception line) and
marked `"truncated": true`.

One producer process, one consumer process. Inside the producer, threads (the env step
pool) are serialized by a lock; the same holds for the consumer side.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import threading
import time
import traceback as _tb
import zlib

import numpy as np

from rlpipe.native.board import load_u64, store_u64

ERROR_LOG_BYTES = 1 << 20
MAX_RECORD_BYTES = 16 << 10  # payload cap of one record (JSON bytes)
TRACEBACK_CHARS = 8 << 10  # traceback text kept in a fresh record
MESSAGE_CHARS = 500  # first line of the exception message

LOG_MAGIC = 0x726C70655F657272  # "rlpe_err"
OFF_MAGIC, OFF_CAPACITY, OFF_MAX_RECORD = 0, 8, 16
OFF_HEAD, OFF_DROPPED, OFF_WRITTEN = 64, 72, 80
OFF_TAIL = 128
HEADER_BYTES = 256
REC_HEADER = struct.Struct("<II")  # length, crc32
SKIP = 0xFFFFFFFF


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _as_u8(buf) -> np.ndarray:
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
        raise ValueError("error log: need a contiguous 1-D uint8 buffer")
    if not arr.flags.writeable:
        raise ValueError("error log: buffer is read-only (both sides store a position)")
    return arr


class ErrorLog:
    """SPSC log of JSON records (a circular buffer) over `buf` (a uint8 array or any writable buffer).

    `create=True` initialises the header (the segment's owner, before the other side
    attaches); `create=False` attaches to an initialised log and raises ValueError if it is
    not one. Either side may create; the producer calls `write`, the consumer `read_all`.
    """

    def __init__(self, buf, create: bool, max_record_bytes: int = MAX_RECORD_BYTES):
        self._u8 = _as_u8(buf)
        self._mv = memoryview(self._u8)
        self._addr = self._u8.ctypes.data
        if self._addr % 8:
            raise ValueError("error log: buffer must be 8-byte aligned (64 preferred)")
        if len(self._u8) < HEADER_BYTES + 1024:
            raise ValueError(f"error log: {len(self._u8)} bytes is too small")
        self._hdr = np.frombuffer(self._u8, dtype=np.uint64, count=HEADER_BYTES // 8)
        self._lock = threading.Lock()
        self.corrupt = 0  # consumer-side: records that failed their check
        if create:
            capacity = (len(self._u8) - HEADER_BYTES) & ~7
            self._u8[:HEADER_BYTES] = 0
            self._hdr[OFF_CAPACITY // 8] = capacity
            self._hdr[OFF_MAX_RECORD // 8] = max_record_bytes
            store_u64(self._addr + OFF_MAGIC, LOG_MAGIC)
        else:
            if load_u64(self._addr + OFF_MAGIC) != LOG_MAGIC:
                raise ValueError(
                    "error log: no error log here (magic mismatch); the creator must "
                    "initialise it with create=True first"
                )
            capacity = int(self._hdr[OFF_CAPACITY // 8])
            if capacity <= 0 or capacity > len(self._u8) - HEADER_BYTES or capacity % 8:
                raise ValueError(f"error log: bad capacity {capacity}")
        self.capacity = capacity
        # the payload cap: fits the data area with room for a skip marker and a header
        self.max_record_bytes = min(int(max_record_bytes), capacity // 2 - REC_HEADER.size)
        self._data = self._mv[HEADER_BYTES : HEADER_BYTES + capacity]
        # Each side owns one position; cache it (re-read from memory once, on attach).
        self._head = load_u64(self._addr + OFF_HEAD)
        self._tail = load_u64(self._addr + OFF_TAIL)
        self._dropped = load_u64(self._addr + OFF_DROPPED)
        self._written = load_u64(self._addr + OFF_WRITTEN)

    # -- producer --------------------------------------------------------------------------

    def write(self, record: dict) -> bool:
        """Append one record (compact JSON, shrunk to the cap if needed). False, and
        `dropped` + 1, when the log has no room; never blocks, never overwrites unread data."""
        payload = encode_record(record, self.max_record_bytes)
        n = len(payload)
        size = _align8(REC_HEADER.size + n)
        cap = self.capacity
        with self._lock:
            head = self._head
            tail = load_u64(self._addr + OFF_TAIL)
            off = head % cap
            skip = cap - off if size > cap - off else 0
            if head + skip + size - tail > cap:
                self._dropped += 1
                store_u64(self._addr + OFF_DROPPED, self._dropped)
                return False
            data = self._data
            if skip:
                REC_HEADER.pack_into(data, off, SKIP, 0)
                off = 0
            REC_HEADER.pack_into(data, off, n, zlib.crc32(payload))
            data[off + REC_HEADER.size : off + REC_HEADER.size + n] = payload
            self._head = head + skip + size
            self._written += 1
            store_u64(self._addr + OFF_WRITTEN, self._written)
            store_u64(self._addr + OFF_HEAD, self._head)  # publish: after the bytes
            return True

    # -- consumer --------------------------------------------------------------------------

    def read_all(self) -> list[dict]:
        """Every record published since the last call, in write order (consumer side)."""
        out: list[dict] = []
        cap = self.capacity
        with self._lock:
            tail = self._tail
            head = load_u64(self._addr + OFF_HEAD)
            if head < tail or head - tail > cap:
                # Not a state a sane producer leaves; resynchronise rather than read garbage.
                self.corrupt += 1
                tail = head
            data = self._data
            while tail < head:
                off = tail % cap
                n, crc = REC_HEADER.unpack_from(data, off)
                if n == SKIP:
                    tail += cap - off
                    continue
                if n > cap - off - REC_HEADER.size or tail + _align8(REC_HEADER.size + n) > head:
                    self.corrupt += 1
                    tail = head
                    break
                payload = bytes(data[off + REC_HEADER.size : off + REC_HEADER.size + n])
                tail += _align8(REC_HEADER.size + n)
                if zlib.crc32(payload) != crc:
                    self.corrupt += 1
                    continue
                try:
                    rec = json.loads(payload)
                except ValueError:
                    self.corrupt += 1
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
                else:
                    self.corrupt += 1
            self._tail = tail
            store_u64(self._addr + OFF_TAIL, tail)  # release: the bytes are copied out
        return out

    # -- counters (either side) ------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Records the producer refused because the log was full (monotonic)."""
        return load_u64(self._addr + OFF_DROPPED)

    @property
    def written(self) -> int:
        """Records the producer accepted (monotonic)."""
        return load_u64(self._addr + OFF_WRITTEN)

    def pending_bytes(self) -> int:
        """Bytes published and not yet consumed."""
        return load_u64(self._addr + OFF_HEAD) - load_u64(self._addr + OFF_TAIL)

    def release(self) -> None:
        """Drop the views into the buffer (so the segment can be unmapped)."""
        self._data = self._mv = self._hdr = self._u8 = None


# --- encoding -------------------------------------------------------------------------------


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _dumps(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":"), default=_json_default, allow_nan=True).encode()


def trim_text(text: str, limit: int, keep_head: float = 0.25) -> str:
    """`text` cut to at most `limit` chars by removing its middle (at line boundaries when
    possible): the start (where it began) and the end (innermost frames and the exception
    line) are what a reader of a traceback needs."""
    if len(text) <= limit:
        return text
    marker_len = 40
    if limit <= marker_len + 8:
        return text[-limit:] if limit > 0 else ""
    budget = limit - marker_len
    head_n = int(budget * keep_head)
    tail_n = budget - head_n
    head = text[:head_n]
    cut = head.rfind("\n")
    if cut > head_n // 2:
        head = head[: cut + 1]
    tail = text[len(text) - tail_n :]
    cut = tail.find("\n")
    if 0 <= cut < tail_n // 2:
        tail = tail[cut + 1 :]
    trimmed = len(text) - len(head) - len(tail)
    marker = f"... [{trimmed} chars trimmed] ...\n"
    if not head.endswith("\n"):
        marker = "\n" + marker
    return head + marker + tail


def encode_record(record: dict, limit: int = MAX_RECORD_BYTES) -> bytes:
    """Compact JSON of `record`, at most `limit` bytes. Oversized records lose the middle of
    their longest strings (the traceback first) and get `"truncated": true`; a record that
    still does not fit is reduced to its identifying fields."""
    payload = _dumps(record)
    if len(payload) <= limit:
        return payload
    rec = dict(record)
    rec["truncated"] = True
    for _ in range(12):
        payload = _dumps(rec)
        excess = len(payload) - limit
        if excess <= 0:
            return payload
        # the longest string field (by encoded size), traceback preferred on a tie
        sizes = {k: len(_dumps({"": v})) for k, v in rec.items() if isinstance(v, str)}
        if not sizes:
            break
        key = max(sizes, key=lambda k: (sizes[k], k == "traceback"))
        value = rec[key]
        enc = sizes[key]
        if enc <= 64:
            break
        # encoded bytes per char can exceed 1 (escapes); shrink proportionally, with margin
        keep = int(len(value) * max(0.0, (enc - excess - 64)) / enc)
        rec[key] = trim_text(value, keep, keep_head=0.25 if key == "traceback" else 0.75)
    minimal = {"truncated": True}
    for key in ("ts", "level", "env_id", "env_type", "error_type", "stacktrace_hash", "message"):
        if key in record:
            value = record[key]
            minimal[key] = value[:200] if isinstance(value, str) else value
    payload = _dumps(minimal)
    if len(payload) > limit:
        payload = _dumps({"truncated": True, "stacktrace_hash": str(record.get("stacktrace_hash", ""))[:64]})
    return payload


# --- records and the stack-trace hash -----------------------------------------------------

_CARET_LINE = re.compile(r"^\s*[\^~]+\s*$")
_FILE_PATH = re.compile(r'File "([^"]*)"')
_HEX_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_HEX_ID = re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"(?<![A-Za-z])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")
_PKG_ROOT = re.compile(r"^.*[/\\](?:site|dist)-packages[/\\]")


def _norm_path(path: str) -> str:
    """A source path without its install prefix: stable across checkouts and venvs."""
    if path.startswith("<"):
        return path
    stripped = _PKG_ROOT.sub("", path)
    if stripped != path:
        return stripped
    parts = re.split(r"[/\\]", path)
    return "/".join(parts[-3:])


def normalize_traceback(text: str) -> str:
    """Traceback text with the noise that varies between occurrences of one bug removed:
    install prefixes of paths, line numbers and all other numbers, memory addresses and
    object ids, hex ids, the 3.11 caret lines, whitespace."""
    out = []
    for line in text.splitlines():
        if not line.strip() or _CARET_LINE.match(line):
            continue
        line = _FILE_PATH.sub(lambda m: f'File "{_norm_path(m.group(1))}"', line)
        line = _HEX_ADDR.sub("<addr>", line)
        line = _HEX_ID.sub("#", line)
        line = _NUMBER.sub("N", line)
        out.append(_SPACES.sub(" ", line).strip())
    return "\n".join(out)


def format_exc_text(exc: BaseException) -> str:
    """The full traceback text of `exc`, chained causes included."""
    return "".join(_tb.format_exception(type(exc), exc, exc.__traceback__))


def stacktrace_hash(exc_or_text: BaseException | str) -> str:
    """md5 (hex) of the normalised traceback of an exception, or of traceback text.

    The same bug hashes the same across line-number drift, addresses, object ids and numbers
    in its message; a different code path (another frame, function or exception type) hashes
    differently. `stacktrace_hash(exc) == stacktrace_hash(format_exc_text(exc))`."""
    if isinstance(exc_or_text, BaseException):
        text = format_exc_text(exc_or_text)
    else:
        text = str(exc_or_text)
    return hashlib.md5(normalize_traceback(text).encode()).hexdigest()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def error_record(env_id, env_type, exc: BaseException, ts: float | None = None) -> dict:
    """The ERROR record a worker writes for an exception of env `env_id` (docs/architecture.md)."""
    text = format_exc_text(exc)
    message = _first_line(str(exc))
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 3] + "..."
    return {
        "ts": round(time.time() if ts is None else float(ts), 3),
        "level": "ERROR",
        "env_id": None if env_id is None else int(env_id),
        "env_type": None if env_type is None else str(env_type),
        "error_type": type(exc).__name__,
        "stacktrace_hash": stacktrace_hash(text),
        "message": message,
        "traceback": trim_text(text, TRACEBACK_CHARS),
        "pid": os.getpid(),
    }


__all__ = [
    "ERROR_LOG_BYTES",
    "MAX_RECORD_BYTES",
    "ErrorLog",
    "encode_record",
    "error_record",
    "format_exc_text",
    "normalize_traceback",
    "stacktrace_hash",
    "trim_text",
]
