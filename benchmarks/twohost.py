"""Two hosts on one machine: a DD-PPO job of two torchrun nodes, each in a network namespace of
its own, joined by one veth link over TCP (used by tests/test_twohost.py and
benchmarks/twohost_link.py).

Each "host" is a network namespace (its own loopback, its own end of the veth, called eth0
there, with an address of a /30 that exists only inside the two namespaces), a UTS namespace
(its own hostname) and a mount namespace in which the job directory is the host's own
directory: both nodes are started with the same command line and the same `hydra.run.dir`,
as on two real nodes with local disks, and each writes to its own disk (`<base>/host-a`,
`<base>/host-b`). Each runs its own engine and embedded Redis (its unix socket is in the
host's run directory). /dev/shm and /tmp are the machine's: segment names carry the driver's
pid, which the two hosts share one numbering of.

Everything made here is named `rl2h<pid>...` (the harness process's pid): `close()` (also
run at exit and on SIGTERM/SIGHUP/SIGINT) stops the torchrun agents, SIGKILLs whatever is
left in the namespaces, deletes the namespaces (their veth ends and qdiscs go with them),
stops the link emulator and sweeps the segments and socket dirs of the dead ranks. A harness
that was SIGKILLed itself leaves namespaces named after a dead pid: the next one sweeps them
(`sweep_stale`), and its torchrun agents got SIGTERM from the kernel (PR_SET_PDEATHSIG).

    python benchmarks/twohost.py [overrides...]    # one short job, prints rank 0's summary
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).parent / "torchrun"
PREFIX = "rl2h"
SUBNET = "10.213.0"  # a /30 that exists only inside the two namespaces this harness makes
ADDRS = {"a": f"{SUBNET}.1", "b": f"{SUBNET}.2"}  # host a sorts first: c10d gives it node rank 0
RDZV_PORT = 29400
IFNAME = "eth0"  # the veth end's name inside each namespace (GLOO_SOCKET_IFNAME)
# What each node's environment needs (docs/scale-out.md, "Two nodes"): gloo binds to the link's
# interface (by default it binds to what the hostname resolves to); and torchrun's agents do
# not share their rendezvous store with the ranks: with the shared store (torch's default) an
# agent that joins after a host was lost waits for a MASTER_ADDR the surviving agent never
# writes again, and both fail after 60 s (torch 2.13, measured with this harness).
NODE_ENV = {"GLOO_SOCKET_IFNAME": IFNAME, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces_unavailable() -> str | None:
    """None when network namespaces can be made here, else one line saying why not."""
    if shutil.which("ip") is None:
        return "two-host harness: no `ip` command (iproute2 is not installed)"
    if os.geteuid() != 0:
        return "two-host harness: network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    if shutil.which("unshare") is None:
        return "two-host harness: no `unshare` command (util-linux is not installed)"
    probe = f"{PREFIX}{os.getpid()}p"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"two-host harness: `ip netns add` fails here ({made.stderr.strip()})"
    _ip("netns", "del", probe, check=False)
    return None


def netem_unavailable() -> str | None:
    """None when the kernel has the netem qdisc (probed on a dummy veth in a namespace)."""
    ns = f"{PREFIX}{os.getpid()}q"
    try:
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "add", "q0", "type", "veth", "peer", "name", "q1")
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "q0", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
        )
        return None if out.returncode == 0 else f"no netem qdisc in this kernel ({out.stderr.strip()})"
    finally:
        _ip("netns", "del", ns, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in out.stdout.split()] if out.returncode == 0 else []


def kill_ns(ns: str) -> list[int]:
    """SIGKILL every process in a namespace (a power loss), until none is left."""
    killed: list[int] = []
    for _ in range(50):
        pids = ns_pids(ns)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.1)
    return sorted(set(killed))


def sweep_stale() -> list[str]:
    """Namespaces of harnesses that died without their cleanup (named after a dead pid)."""
    out = _ip("netns", "list", check=False)
    removed = []
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)[a-z]", name)
        if m and not _pid_alive(int(m.group(1))):
            kill_ns(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def _sweep_rank_leftovers() -> None:
    """Segments and socket dirs of ranks that were SIGKILLed (rlpipe's own sweeps: they remove
    only what belongs to dead pids)."""
    from rlpipe.shm.segment import sweep_dead_segments
    from rlpipe.supervisor.services import sweep_dead_socket_dirs

    sweep_dead_segments()
    sweep_dead_socket_dirs()


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the agent stops its ranks


class Node:
    """One host: its namespace, its address on the link, its disk, its torchrun agent."""

    def __init__(self, name: str, ns: str, addr: str, host_dir: Path):
        self.name, self.ns, self.addr = name, ns, addr  # name: "a" or "b"
        self.host_dir = host_dir  # this host's disk: the job directory in its mount namespace
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.starts = 0


class TwoHosts:
    """Two namespaces joined by a veth link; `start_node` runs torchrun in one of them."""

    def __init__(self, base: Path | None = None, link=None):
        """`link`: None for the veth pair; else an emulated link (benchmarks/twohost_link.py's
        `Wire`) that makes the two ends itself (`start(ns_a, ns_b, ifname)`, `close()`)."""
        sweep_stale()
        self.tag = f"{PREFIX}{os.getpid()}"
        self.base = Path(base or tempfile.mkdtemp(prefix=self.tag, dir="/tmp"))  # short: unix socket paths
        self.owns_base = base is None
        self.job_dir = self.base / "job"  # the path both nodes are given (a mount point in each)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.nodes = {n: Node(n, f"{self.tag}{n}", ADDRS[n], self.base / f"host-{n}") for n in ("a", "b")}
        self.hosts_file = self.base / "hosts"
        self.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} host-{n}\n" for n, addr in ADDRS.items()))
        self.link = link
        self.closed = False
        self._old_handlers = {}
        atexit.register(self.close)
        self._trap_signals()
        try:
            self._make_network()
        except BaseException:
            self.close()
            raise

    # -- the network -----------------------------------------------------------------------------
    def _make_network(self) -> None:
        a, b = self.nodes["a"], self.nodes["b"]
        for node in (a, b):
            node.host_dir.mkdir(parents=True, exist_ok=True)
            _ip("netns", "add", node.ns)
            _ip("-n", node.ns, "link", "set", "lo", "up")
        if self.link is not None:
            self.link.start(a.ns, b.ns, IFNAME)
        else:
            # made inside namespace a, so no interface of ours ever exists in the machine's namespace
            _ip("-n", a.ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", b.ns)
            for node, dev in ((a, "v0"), (b, "v1")):
                _ip("-n", node.ns, "link", "set", dev, "name", IFNAME)
        for node in (a, b):
            _ip("-n", node.ns, "addr", "add", f"{node.addr}/30", "dev", IFNAME)
            _ip("-n", node.ns, "link", "set", IFNAME, "up")

    def netem(self, *params: str) -> None:
        """netem on both ends of the veth (each direction gets `params`: `delay 20ms rate
        100mbit loss 0.5%`), where the kernel has it (`netem_unavailable()`)."""
        for node in self.nodes.values():
            cmd = ["ip", "netns", "exec", node.ns, "tc", "qdisc", "add", "dev", IFNAME, "root", "netem", *params]
            subprocess.run(cmd, check=True, capture_output=True)

    def set_link(self, node: str, up: bool) -> None:
        _ip("-n", self.nodes[node].ns, "link", "set", IFNAME, "up" if up else "down")

    def ns_exec(self, node: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.nodes[node].ns, *cmd], **kw)

    # -- the nodes -------------------------------------------------------------------------------
    def torchrun_cmd(self, node: str, overrides: list[str], rdzv_id: str, max_restarts: int = 0) -> list[str]:
        """The torchrun command line of one node: the one docs/scale-out.md gives for two real
        nodes, with this harness's addresses and directories."""
        me = self.nodes[node]
        return [
            str(TORCHRUN),
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ADDRS['a']}:{RDZV_PORT}",
            f"--rdzv-id={rdzv_id}",
            f"--local-addr={me.addr}",
            f"--max-restarts={max_restarts}",
            f"--log-dir={self.job_dir / 'torchrun'}",
            "-m",
            "rlpipe",
            f"hydra.run.dir={self.job_dir / 'run'}",
            *overrides,
        ]

    def start_node(
        self, node: str, overrides: list[str], rdzv_id: str | None = None, max_restarts: int = 0, env=None
    ) -> subprocess.Popen:
        """torchrun on `node`, in its namespaces: its hostname is host-<node>, and the job
        directory is the host's own directory."""
        me = self.nodes[node]
        cmd = self.torchrun_cmd(node, overrides, rdzv_id or self.tag, max_restarts)
        # hostname and bind mounts happen inside the new UTS and mount namespaces only; the
        # hosts file is the cluster's name service (torchrun resolves its own hostname)
        inner = (
            f'hostname host-{node} && mount --bind "{me.host_dir}" "{self.job_dir}" '
            f'&& mount --bind "{self.hosts_file}" /etc/hosts && exec "$@"'
        )
        full = ["ip", "netns", "exec", me.ns, "unshare", "--uts", "--mount", "sh", "-c", inner, "sh", *cmd]
        me.starts += 1
        me.log_path = self.base / f"host-{node}.{me.starts}.log"
        child_env = {**os.environ, **NODE_ENV, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(me.log_path, "w") as log:
            me.proc = subprocess.Popen(
                full,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return me.proc

    def output(self, node: str) -> str:
        path = self.nodes[node].log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def wait(self, node: str, timeout: float) -> int | None:
        """The node's torchrun exit code, or None if it still runs after `timeout` s."""
        try:
            return self.nodes[node].proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def lose_host(self, node: str) -> list[int]:
        """A power loss: the host's link goes down (no FIN or RST reaches its peer) and every
        process in its namespace is SIGKILLed. Returns the pids killed."""
        self.set_link(node, False)
        killed = kill_ns(self.nodes[node].ns)
        proc = self.nodes[node].proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        return killed

    def run_dir(self, node: str) -> Path:
        """Where this host's rank wrote (rank 0: the run root; rank N: its rank<N>/ there)."""
        return self.nodes[node].host_dir / "run"

    # -- the end ---------------------------------------------------------------------------------
    def _trap_signals(self) -> None:
        """A SIGTERM/SIGHUP/SIGINT to the process running the harness unwinds it (finally blocks
        and close() run) instead of ending it where it stands."""
        try:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: close() runs at exit and from the caller's finally
            self._old_handlers = {}

    def _on_signal(self, signum, frame):
        self.close()
        raise SystemExit(128 + signum)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for node in self.nodes.values():  # a clean stop first: each rank tears down its engine
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(max(0.1, deadline - time.monotonic()))
        for node in self.nodes.values():
            kill_ns(node.ns)
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()
        if self.link is not None:
            self.link.close()
        for node in self.nodes.values():
            _ip("netns", "del", node.ns, check=False)  # its veth end and qdiscs go with it
        _sweep_rank_leftovers()
        if self.owns_base:
            shutil.rmtree(self.base, ignore_errors=True)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        atexit.unregister(self.close)

    def leftovers(self) -> list[str]:
        """What of this harness still exists: namespaces, interfaces named after it."""
        found = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if self.tag in line]
        found += [line for line in _ip("-o", "link", check=False).stdout.splitlines() if self.tag in line]
        return found

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def short_job(steps: int = 4000) -> list[str]:
    """The default test's job: CartPole, 2 x 32 envs, a few thousand env steps."""
    return [
        "env_mix=cartpole",
        "env_count=64",
        "groups.size=32",
        f"run.total_env_steps={steps}",
        "run.duration_s=120",
        "logging.random_return_episodes=0",
        "logging.initial_policy_episodes=0",
        "logging.progress_interval_s=2",
    ]


def main() -> None:
    reason = namespaces_unavailable()
    if reason:
        print(reason)
        sys.exit(0)
    with TwoHosts() as hosts:
        print(f"twohost: {hosts.tag} in {hosts.base}", flush=True)  # what a test waits for
        overrides = short_job() + sys.argv[1:]
        for node in ("a", "b"):
            hosts.start_node(node, overrides)
        codes = {node: hosts.wait(node, 300) for node in ("a", "b")}
        summary = hosts.run_dir("a") / "summary.json"
        print(
            json.dumps({"exit_codes": codes, "summary": json.loads(summary.read_text()) if summary.exists() else None})
        )
        if any(codes.values()):
            print(hosts.output("a")[-3000:], hosts.output("b")[-3000:], sep="\n")


if __name__ == "__main__":
    main()
