"""DD-PPO across two hosts for real: two network namespaces joined by a veth link, a torchrun
node in each (c10d rendezvous on host a's address over TCP), each host with its own run
directory, embedded Redis and engine (benchmarks/twohost.py). Skipped, with one line, where
namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, load_benchmark

twohost = load_benchmark("twohost")
UNAVAILABLE = twohost.namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")


def _alive(pids) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _nothing_left(tag: str, pids) -> None:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert tag not in netns and tag not in links, (netns, links)
    assert _alive(pids) == []
    for pid in pids:
        assert not list(Path("/dev/shm").glob(f"rlpipe_{pid}-*"))
        assert not list(Path("/tmp").glob(f"rlpipe_{pid}-*"))


@needs_namespaces
def test_two_hosts_over_a_veth_link_train_in_sync_and_leave_nothing():
    """CartPole, 2 x 32 envs, 4,000 env steps: both nodes exit 0; the policy, PopArt,
    optimizer and schedule checksums are equal on both hosts; each host's disk holds its own
    rank's outputs and says which host (hostname, address on the link) it ran on; rank 0's
    summary names both; then no namespace, link, process, segment or socket dir is left."""
    with twohost.TwoHosts() as hosts:
        for node in ("a", "b"):
            hosts.start_node(node, twohost.short_job(4000))
        codes = {node: hosts.wait(node, 240) for node in ("a", "b")}
        logs = hosts.output("a")[-3000:] + "\n---\n" + hosts.output("b")[-3000:]
        assert codes == {"a": 0, "b": 0}, logs
        run_a, run_b = hosts.run_dir("a"), hosts.run_dir("b")
        s0 = json.loads((run_a / "summary.json").read_text())
        s1 = json.loads((run_b / "rank1" / "summary.json").read_text())
        # each host wrote to its own disk only (the same hydra.run.dir on both command lines)
        assert not (run_a / "rank1").exists() and not (run_b / "summary.json").exists()
        assert (run_a / "tb").is_dir() and (run_b / "rank1" / "checkpoints").is_dir()
        tag = hosts.tag
    d0, d1 = s0["dist"], s1["dist"]
    assert d0["world_size"] == 2 and d0["params_in_sync"] is True and all(d0["state_in_sync"].values())
    sums = [r["checksums"] for r in d0["ranks"]]
    assert sums[0] == sums[1] and set(sums[0]) == {"policy", "popart", "optimizer", "schedule"}
    assert (d0["host"], d0["addr"]) == ("host-a", twohost.ADDRS["a"])
    assert (d1["host"], d1["addr"], d1["rank"]) == ("host-b", twohost.ADDRS["b"], 1)
    assert d0["hosts"] == [
        {"rank": 0, "host": "host-a", "addr": twohost.ADDRS["a"]},
        {"rank": 1, "host": "host-b", "addr": twohost.ADDRS["b"]},
    ]
    assert s0["env_steps"] >= 4000 and s0["updates"] == s1["updates"] > 0
    _nothing_left(tag, [r["pid"] for r in d0["ranks"]])


def _ranks_running(base: Path) -> bool:
    return all(
        (base / f"host-{n}" / "run" / sub / "lifecycle.sqlite").exists() for n, sub in (("a", ""), ("b", "rank1"))
    )


@needs_namespaces
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGKILL"]
)
def test_the_harness_killed_mid_job_leaves_nothing(sig):
    """The harness script stopped while both ranks run: SIGTERM unwinds it (its cleanup runs);
    after SIGKILL the agents get SIGTERM from the kernel and the next harness sweeps the
    namespaces named after the dead pid. Either way nothing of the job is left."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "twohost.py"), "run.total_env_steps=10000000", "run.duration_s=300"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("twohost: "), first
        tag, base = first.split()[1], Path(first.split()[3])
        deadline = time.monotonic() + 120
        while not _ranks_running(base) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
        assert _ranks_running(base), proc.stdout.read()[-3000:] if proc.poll() is not None else "no ranks in 120 s"
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(tree) > 4  # agents, ranks, workers, Redis servers
        proc.send_signal(sig)
        proc.wait(90)
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + 60  # PR_SET_PDEATHSIG: the agents stop their ranks
            while _alive(tree) and time.monotonic() < deadline:
                time.sleep(0.3)
            assert tag in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert {f"{tag}a", f"{tag}b"} <= set(twohost.sweep_stale())
            twohost._sweep_rank_leftovers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _nothing_left(tag, tree)
    if sig == signal.SIGTERM:
        assert not base.exists()  # the harness's own cleanup ran
    else:  # a SIGKILLed harness cannot remove its temp dir: that is the caller's
        import shutil

        shutil.rmtree(base, ignore_errors=True)


# -- a host lost (power loss: link down, every process SIGKILLed) --------------------------------

LOSS_JOB = [
    "env_mix=cartpole",
    "env_count=16",
    "groups.size=8",
    "learner.update_envs=16",
    "learner.checkpoint_interval_s=1",
    "run.duration_s=600",
    "dist.timeout_s=20",  # how long a rank waits for a lost peer (default 300 s)
    "logging.random_return_episodes=0",
    "logging.initial_policy_episodes=0",
]


def _wait_for_checkpoints(hosts, timeout_s: float = 120) -> None:
    dirs = [hosts.run_dir("a") / "checkpoints", hosts.run_dir("b") / "rank1" / "checkpoints"]
    deadline = time.monotonic() + timeout_s
    while not all(list(d.glob("ckpt_*.pt")) for d in dirs):
        running = all(hosts.nodes[n].proc.poll() is None for n in ("a", "b"))
        assert running and time.monotonic() < deadline, hosts.output("a")[-3000:] + hosts.output("b")[-3000:]
        time.sleep(0.2)


@needs_namespaces
@pytest.mark.slow
def test_host_lost_without_restarts_ends_host_a_with_a_clear_error():
    """Host b loses power after both ranks checkpointed: host a's rank notices within
    dist.timeout_s (its collective or its wait for the round times out; no FIN or RST
    arrives), says so in one line and exits 3, torchrun names it and exits non-zero; nothing
    of either host is left."""
    with twohost.TwoHosts() as hosts:
        for node in ("a", "b"):
            hosts.start_node(node, [*LOSS_JOB, "run.total_env_steps=100000000"])
        _wait_for_checkpoints(hosts)
        killed = hosts.lose_host("b")
        lost_at = time.monotonic()
        code = hosts.wait("a", 180)  # a hang would be 600 s (run.duration_s) or never
        noticed_s = time.monotonic() - lost_at
        out = hosts.output("a")
        survivors = [p for n in ("a", "b") for p in twohost.ns_pids(hosts.nodes[n].ns)]
        tag = hosts.tag
    print(f"host a exited {code} {noticed_s:.1f} s after host b was lost (dist.timeout_s=20)")
    assert code not in (None, 0), out[-3000:]
    assert "rlpipe: rank 0/2: " in out and ("Another rank of the job died" in out or "peer rank is gone" in out), out[
        -3000:
    ]
    assert "exitcode  : 3" in out and "host      : host-a" in out, out[-3000:]
    assert survivors == []
    _nothing_left(tag, killed)


@needs_namespaces
@pytest.mark.slow
def test_host_lost_and_back_with_max_restarts_resumes_in_sync():
    """--max-restarts=1 on both nodes; host b loses power after both ranks checkpointed and
    comes back (a new torchrun agent, as after a reboot): host a's agent restarts its rank, both
    ranks resume from their newest checkpoints (env steps continue, counted over both), the
    job ends at run.total_env_steps with exit 0 on both hosts and every checksum equal, and
    nothing of b's dead generation (processes, segments, socket dirs) is left."""
    total = 40000
    job = [*LOSS_JOB, f"run.total_env_steps={total}"]
    with twohost.TwoHosts() as hosts:
        for node in ("a", "b"):
            hosts.start_node(node, job, max_restarts=1)
        _wait_for_checkpoints(hosts)
        killed = hosts.lose_host("b")
        lost_at = time.monotonic()
        time.sleep(3)  # b is off
        hosts.set_link("b", True)
        hosts.start_node("b", job, max_restarts=1)
        codes = {n: hosts.wait(n, 300) for n in ("a", "b")}
        done_s = time.monotonic() - lost_at
        logs = hosts.output("a")[-4000:] + "\n---\n" + hosts.output("b")[-4000:]
        assert codes == {"a": 0, "b": 0}, logs
        s0 = json.loads((hosts.run_dir("a") / "summary.json").read_text())
        s1 = json.loads((hosts.run_dir("b") / "rank1" / "summary.json").read_text())
        tag = hosts.tag
    print(
        f"job done {done_s:.1f} s after host b was lost; resumed at {s0['resumed_from_step']} / {s1['resumed_from_step']}"
    )
    d0, d1 = s0["dist"], s1["dist"]
    assert d0["params_in_sync"] is True and all(d0["state_in_sync"].values()), d0
    assert d1["params_in_sync"] is True
    assert s0["resumed_from_step"] > 0 and s1["resumed_from_step"] > 0  # each from its own disk
    assert d1["restart"] == 0  # b's new agent counts from 0 ...
    assert d0["job_restarted"] is d1["job_restarted"] is True  # ... yet both resumed
    assert d0["attempt"] == d1["attempt"] == 2
    assert s0["env_steps"] >= total and s0["updates"] == s1["updates"] > 0
    assert {h["host"] for h in d0["hosts"]} == {"host-a", "host-b"}
    _nothing_left(tag, killed)


# -- the emulated link (benchmarks/twohost_link.py) ----------------------------------------------

ECHO_SERVER = """
import socket
s = socket.create_server(("{addr}", 5000))
print("listening", flush=True)
c, _ = s.accept()
while data := c.recv(65536):
    c.sendall(data)
"""
ECHO_CLIENT = """
import socket, time, json
c = socket.create_connection(("{addr}", 5000), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(5):
    t = time.monotonic()
    c.sendall(b"x" * 100)
    got = b""
    while len(got) < 100:
        got += c.recv(100)
    rtts.append(time.monotonic() - t)
print(json.dumps(rtts))
"""


@needs_namespaces
def test_the_emulated_link_carries_tcp_with_its_delay_and_is_gone_after():
    """The user-space link (TUN ends in each namespace, one process between them) carries a TCP
    connection from host a to host b; no round trip beats twice the one-way delay (a lower
    bound: the emulator cannot deliver a packet early); its packet counts come back; and
    nothing (namespaces, TUN devices, the emulator) is left after close."""
    link_mod = load_benchmark("twohost_link")
    wire = link_mod.Wire(1e8, 0.01, 0.0)
    with twohost.TwoHosts(link=wire) as hosts:
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                hosts.nodes["b"].ns,
                sys.executable,
                "-c",
                ECHO_SERVER.format(addr=twohost.ADDRS["b"]),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout.readline().strip() == "listening"
            client = hosts.ns_exec(
                "a",
                sys.executable,
                "-c",
                ECHO_CLIENT.format(addr=twohost.ADDRS["b"]),
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            server.kill()
            server.wait()
        assert client.returncode == 0, client.stderr
        rtts = json.loads(client.stdout)
        emulator = wire.proc
        tag = hosts.tag
    assert len(rtts) == 5 and min(rtts) >= 0.02
    assert wire.counts and wire.counts["packets"] >= 10 and wire.counts["lost"] == 0
    assert emulator.poll() is not None
    _nothing_left(tag, [emulator.pid, server.pid])


# -- what needs no namespace ----------------------------------------------------------------------


def test_the_documented_two_node_command_is_the_harness_command():
    """docs/scale-out.md's node-A command line has the flags and environment the harness runs
    (addresses, ids and directories aside)."""
    doc = (REPO / "docs" / "scale-out.md").read_text()
    block = doc[doc.index("# node A") : doc.index("# node B")]
    documented = {tok.split("=")[0] for tok in block.split() if tok.startswith("--")}
    hosts = twohost.TwoHosts.__new__(twohost.TwoHosts)  # the command only, no namespaces
    hosts.nodes = {"a": twohost.Node("a", "ns", twohost.ADDRS["a"], Path("/x"))}
    hosts.job_dir = Path("/job")
    cmd = hosts.torchrun_cmd("a", [], "job42", max_restarts=3)
    harness = {tok.split("=")[0] for tok in cmd if tok.startswith("--")}
    assert documented == harness, documented ^ harness
    for name, value in twohost.NODE_ENV.items():
        assert f"{name}={'eth0' if value == twohost.IFNAME else value}" in block
    assert "-m rlpipe hydra.run.dir=" in block


def test_ranks_agree_on_an_attempt_token_and_a_stale_request_does_not_confuse_them():
    """rlpipe.ranks.generation over a real TCPStore: a request left by a dead rank 1 of an
    earlier attempt is answered (nobody reads it) and the live rank 1 gets rank 0's token."""
    import threading
    from datetime import timedelta

    import torch.distributed as tdist

    from rlpipe.ranks.generation import AttemptToken

    timeout = timedelta(seconds=30)
    server = tdist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timeout, wait_for_workers=False)
    port = server.port

    def client():
        return tdist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timeout)

    server.set("rlpipe/j/attempt/ask/1", "dead-rank-of-an-earlier-attempt")
    zero = AttemptToken(client(), client, 0, 2, "j")
    token0 = zero.agree()
    # rank 0 answers the stale request (nobody reads the answer) before the live rank 1 asks
    assert server.get("rlpipe/j/attempt/token/dead-rank-of-an-earlier-attempt").decode() == token0
    got = {}
    one = threading.Thread(target=lambda: got.update(t=AttemptToken(client(), client, 1, 2, "j").agree()))
    one.start()
    one.join(30)
    zero.done()
    assert got["t"] == token0


def test_a_round_nobody_else_announces_fails_after_the_timeout(monkeypatch):
    """A rank that announced its rollout and waits longer than dist.timeout_s for the others
    (a lost host's rank never announces) raises RankLost naming the round, not a hang."""
    from rlpipe.ranks import sync

    monkeypatch.setattr(sync, "POLL_S", 0.0)

    class Store:
        def __init__(self):
            self.kv = {}

        def add(self, key, amount):
            self.kv[key] = self.kv.get(key, 0) + amount
            return self.kv[key]

    rounds = sync.Rounds(Store(), 0, 2, 0.6, timeout_s=0.05)
    assert not rounds.due(have_rollout=True, want_stop=False)
    time.sleep(0.1)
    with pytest.raises(sync.RankLost, match="update round 0 had 1 of the 2 ranks"):
        rounds.due(have_rollout=True, want_stop=False)
