"""DD-PPO over a slow and a lossy link: updates per minute and the all-reduce's share of an
update, measured on two hosts (benchmarks/twohost.py) joined by a shaped link, beside what
docs/scale-out.md's arithmetic predicts for that link.

Links (each direction gets the rate, the delay and the loss; the round trip is twice the delay):

    veth           the plain veth pair (no shaping)
    wire           the emulated link below, unshaped (what the emulator itself costs)
    1gbit-1ms      1 Gbit/s, 1 ms
    100mbit-20ms   100 Mbit/s, 20 ms, 0.5 % loss

The shaping is netem's where the kernel has it (`tc qdisc ... netem delay D rate R loss L` on
both veth ends). Where it has not (this machine's kernel is built without sch_netem), `Wire`
stands in: the two ends are TUN devices, one in each namespace, and one process moves the IP
packets between them, each direction a FIFO that serializes packets at the rate, delivers
them the delay later, drops each with the loss probability and tail-drops past 1,000 queued
packets (netem's default limit). It is a real IP link: TCP sees the delay, the rate and the
loss, retransmits, and shrinks its window.

    python benchmarks/twohost_link.py [--seconds 45] [--links veth,1gbit-1ms,100mbit-20ms]
    python benchmarks/twohost_link.py --wire NS_A NS_B IFNAME RATE_BPS DELAY_S LOSS   # the emulator
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import twohost  # noqa: E402

LINKS = {  # rate (bit/s), one-way delay (s), loss probability
    "veth": None,
    "wire": (0.0, 0.0, 0.0),
    "1gbit-1ms": (1e9, 0.001, 0.0),
    "100mbit-20ms": (1e8, 0.020, 0.005),
}
QUEUE_LIMIT = 1000  # packets per direction, netem's default
CLONE_NEWNET = 0x40000000
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


# -- the emulated link ----------------------------------------------------------------------------


def _tun_in(ns: str, ifname: str) -> int:
    """A TUN device named `ifname` made inside network namespace `ns` (this process enters
    it, makes the device, and returns to its own; the fd keeps the device)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
        os.set_blocking(fd, False)
        return fd
    finally:
        libc.setns(own, CLONE_NEWNET)
        os.close(own)
        os.close(target)


def run_wire(ns_a: str, ns_b: str, ifname: str, rate_bps: float, delay_s: float, loss: float) -> None:
    """Move packets between the two TUN ends until SIGTERM (the devices go with this process)."""
    fds = [_tun_in(ns_a, ifname), _tun_in(ns_b, ifname)]
    print("ready", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    rng = random.Random(0)
    queues: list[list] = [[], []]  # per direction: heap of (deliver_at, seq, packet)
    free_at = [0.0, 0.0]  # when each direction's serializer is free
    seq = 0
    counts = {"packets": 0, "lost": 0, "tail_dropped": 0}
    while not stop:
        now = time.monotonic()
        due = [q[0][0] for q in queues if q]
        timeout = max(0.0, min(due) - now) if due else 0.5
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            d = fds.index(fd)
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                counts["packets"] += 1
                if loss and rng.random() < loss:
                    counts["lost"] += 1
                    continue
                if len(queues[d]) >= QUEUE_LIMIT:
                    counts["tail_dropped"] += 1
                    continue
                sent = max(now, free_at[d]) + (len(packet) * 8 / rate_bps if rate_bps else 0.0)
                free_at[d] = sent
                seq += 1
                heapq.heappush(queues[d], (sent + delay_s, seq, packet))
        now = time.monotonic()
        for d, q in enumerate(queues):
            while q and q[0][0] <= now:
                _, _, packet = heapq.heappop(q)
                with contextlib.suppress(BlockingIOError, OSError):
                    os.write(fds[1 - d], packet)
    print(json.dumps(counts), flush=True)


class Wire:
    """The emulator as a child process of the harness (TwoHosts(link=Wire(...)))."""

    def __init__(self, rate_bps: float, delay_s: float, loss: float):
        self.params = (rate_bps, delay_s, loss)
        self.proc: subprocess.Popen | None = None
        self.counts: dict | None = None

    def start(self, ns_a: str, ns_b: str, ifname: str) -> None:
        cmd = [sys.executable, __file__, "--wire", ns_a, ns_b, ifname, *map(str, self.params)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, preexec_fn=twohost._die_with_parent, start_new_session=True
        )
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the link emulator did not start: {line!r}")

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=10)
            with contextlib.suppress(ValueError, IndexError):
                self.counts = json.loads(out.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the arithmetic of docs/scale-out.md -------------------------------------------------------------


def predicted_allreduce_s(size: int, rate_bps: float, delay_s: float) -> float:
    """docs/scale-out.md's ring all-reduce of `size` bytes over W = 2 ranks:
    `2 (W-1)/W x S / B + 2 (W-1) a` with B the rate and a the one-way delay."""
    return (size / (rate_bps / 8) if rate_bps else 0.0) + 2 * delay_s


def predicted_comm_s(allreduce_bytes: int, gradient_allreduces: int, rate_bps: float, delay_s: float) -> float:
    """Per update: the gradient all-reduces plus two small ones (the header, the per-type sums)."""
    one = predicted_allreduce_s
    return gradient_allreduces * one(allreduce_bytes, rate_bps, delay_s) + 2 * one(40, rate_bps, delay_s)


def probe_allreduce(rank: int, addr: str, size_floats: int, repeats: int, gap_s: float) -> None:
    """One side of a bare gloo all-reduce between the two hosts (run in each namespace):
    `repeats` all-reduces of `size_floats` float32, `gap_s` apart; rank 0 prints the mean s."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{twohost.RDZV_PORT + 1}", rank=rank, world_size=2)
    t = torch.ones(size_floats)
    dist.all_reduce(t)  # the connection is up and warm
    spent = 0.0
    for _ in range(repeats):
        dist.barrier()
        time.sleep(gap_s)
        start = time.perf_counter()
        dist.all_reduce(t)
        spent += time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"allreduce_s": spent / repeats}), flush=True)
    dist.destroy_process_group()


def measure_allreduce(link: str, size_floats: int, repeats: int = 30, gap_s: float = 0.0) -> float:
    """The mean time of a bare all-reduce of `size_floats` floats over the link."""
    shape = LINKS[link]
    netem = twohost.netem_unavailable() is None
    wire = Wire(*shape) if shape is not None and not netem else None
    with twohost.TwoHosts(link=wire) as hosts:
        if shape is not None and netem and link != "wire":
            rate, delay, loss = shape
            hosts.netem("delay", f"{delay * 1000:g}ms", "rate", f"{rate:.0f}bit", "loss", f"{loss * 100:g}%")
        env = {**os.environ, **twohost.NODE_ENV}
        args = [twohost.ADDRS["a"], str(size_floats), str(repeats), str(gap_s)]
        procs = [
            subprocess.Popen(
                ["ip", "netns", "exec", hosts.nodes[n].ns, sys.executable, __file__, "--probe", str(r), *args],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for r, n in enumerate("ab")
        ]
        out = [p.communicate(timeout=300)[0] for p in procs]
    return json.loads(out[0].strip().splitlines()[-1])["allreduce_s"]


def predict_from_veth(veth: dict, row: dict) -> dict:
    """What the arithmetic predicts for a shaped link from the veth run: the update cycle grows
    by the predicted communication (the cartpole mix trains on-policy: stepping waits out each
    update), and the all-reduce share is the predicted communication over the veth run's
    compute per update (its round time less its time in collectives) plus that communication."""
    comm = row["predicted_comm_s_per_update"]
    compute = sum(veth["round_s_per_update"]) / 2 - sum(veth["collective_s_per_update"]) / 2
    return {
        "predicted_updates_per_min": round(60 / (60 / veth["updates_per_min"] + comm), 1),
        "predicted_allreduce_share": round(comm / (compute + comm), 3),
    }


def job(seconds: float) -> list[str]:
    return [
        "env_mix=cartpole",
        "env_count=64",
        "groups.size=32",
        "run.total_env_steps=null",
        f"run.duration_s={seconds}",
        "logging.random_return_episodes=0",
        "logging.initial_policy_episodes=0",
    ]


def measure(link: str, seconds: float) -> dict:
    shape = LINKS[link]
    netem = twohost.netem_unavailable() is None
    wire = Wire(*shape) if shape is not None and not netem else None
    with twohost.TwoHosts(link=wire) as hosts:
        if shape is not None and netem and link != "wire":
            rate, delay, loss = shape
            hosts.netem("delay", f"{delay * 1000:g}ms", "rate", f"{rate:.0f}bit", "loss", f"{loss * 100:g}%")
        load_before = os.getloadavg()[0]
        for node in ("a", "b"):
            hosts.start_node(node, job(seconds))
        codes = {n: hosts.wait(n, seconds + 240) for n in ("a", "b")}
        load_after = os.getloadavg()[0]
        if codes != {"a": 0, "b": 0}:
            raise RuntimeError(f"{link}: exit codes {codes}\n{hosts.output('a')[-3000:]}\n{hosts.output('b')[-3000:]}")
        s0 = json.loads((hosts.run_dir("a") / "summary.json").read_text())
    training_s = s0["wall_s"] - s0["startup_first_step_s"] - s0.get("teardown_s", 0.0)
    ranks = s0["dist"]["ranks"]
    updates = s0["updates"]
    return {
        "link": link,
        "shaping": "none" if shape is None else ("netem" if netem else "wire (user-space TUN emulator)"),
        "updates": updates,
        "updates_per_min": round(updates / training_s * 60, 1),
        "round_s_per_update": [round(r["round_s"] / max(updates, 1), 4) for r in ranks],
        "collective_s_per_update": [round(r["collective_s"] / max(updates, 1), 4) for r in ranks],
        "collectives_per_update": round(ranks[0]["collectives"] / max(updates, 1), 1),
        "allreduce_share": [round(r["collective_s"] / r["round_s"], 3) if r["round_s"] else None for r in ranks],
        "sps": s0["sps"],
        "sps_per_rank": [r["sps"] for r in ranks],
        "params_in_sync": s0["dist"]["params_in_sync"],
        "load_avg_1min": [round(load_before, 2), round(load_after, 2)],
        "wire_packets": wire.counts if wire else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="run.duration_s of each job")
    parser.add_argument("--links", default="veth,wire,1gbit-1ms,100mbit-20ms")
    parser.add_argument("--wire", nargs=6, metavar=("NS_A", "NS_B", "IFNAME", "RATE", "DELAY", "LOSS"))
    parser.add_argument("--probe", nargs=5, metavar=("RANK", "ADDR", "FLOATS", "REPEATS", "GAP_S"))
    args = parser.parse_args()
    if args.probe:
        rank, addr, floats, repeats, gap = args.probe
        probe_allreduce(int(rank), addr, int(floats), int(repeats), float(gap))
        return
    if args.wire:
        ns_a, ns_b, ifname, rate, delay, loss = args.wire
        run_wire(ns_a, ns_b, ifname, float(rate), float(delay), float(loss))
        return
    reason = twohost.namespaces_unavailable()
    if reason:
        print(reason)
        return
    import dist_allreduce  # the policy's all-reduce size, as docs/scale-out.md counts it

    spec = dist_allreduce._spec(["env_mix=cartpole"])
    _, policy = dist_allreduce._policy(spec)
    params = list(policy.parameters())
    size = 4 * (sum(p.numel() for p in params) + len(params) + 1)
    lc = spec.learner
    grads = lc.epochs * -(-(lc.update_envs * lc.rollout_len) // lc.minibatch_size)
    results = []
    for link in args.links.split(","):
        shape = LINKS[link]
        row = {}
        for gap in (0.0, 0.5):  # back to back, and after the idle time between two updates
            row[f"bare_allreduce_s_gap{gap:g}"] = round(measure_allreduce(link, size // 4, gap_s=gap), 5)
        if shape is not None and shape[0]:
            row["predicted_allreduce_s"] = round(predicted_allreduce_s(size, shape[0], shape[1]), 5)
            row["predicted_comm_s_per_update"] = round(predicted_comm_s(size, grads, shape[0], shape[1]), 4)
        row.update(measure(link, args.seconds))
        veth = next((r for r in results if r["link"] == "veth"), None)
        if veth is not None and "predicted_comm_s_per_update" in row:
            row.update(predict_from_veth(veth, row))
        results.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"allreduce_bytes": size, "gradient_allreduces_per_update": grads, "cores": os.cpu_count()}))


if __name__ == "__main__":
    main()
