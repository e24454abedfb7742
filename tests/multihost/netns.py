"""Several "hosts" on one machine: Linux network namespaces joined by a bridge.

Each host is a network namespace ``forgeh<i>`` with its own address ``10.77.0.<i+1>/24`` on a
veth whose other end is enslaved to the bridge ``forgebr0`` (``10.77.0.1/24``) in the root
namespace, where the controller runs::

    root namespace: controller, forgebr0 10.77.0.1 ──┬── veth fgh1 ── forgeh1: eth0 10.77.0.2
                                                     └── veth fgh2 ── forgeh2: eth0 10.77.0.3

This module makes the network; ``tests/multihost/cluster.py`` adds private mounts and a Ray
node per host (the hosts that share nothing). Command line (as root)::

    python -m tests.multihost.netns up --hosts 2
    python -m tests.multihost.netns status
    python -m tests.multihost.netns kill forgeh2     # fail a host: SIGKILL all its processes
    python -m tests.multihost.netns down

``up`` is idempotent (it tears down what an earlier run left first); ``down`` always removes
every namespace, link and process this harness made.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = "forgeh"  # namespaces forgeh1, forgeh2, ...
BRIDGE = "forgebr0"
SUBNET = "10.77.0"
START_TIMEOUT_S = 60.0


@dataclass
class NetnsHost:
    """One simulated host: its namespace, address and (once started) its main process (a Ray
    node, or Monarch's worker loop)."""

    ns: str
    ip: str
    agent: subprocess.Popen | None = None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (None if they can): needs root and ``ip netns``."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the multihost tests as root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}probe"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` failed: {e.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def namespaces() -> list[str]:
    """This harness's namespaces that exist now."""
    out = _ip("netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit())


def ns_pids(ns: str) -> list[int]:
    """Pids of every process in namespace ``ns``."""
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def kill_host(ns: str) -> list[int]:
    """Fail a host: SIGKILL every process in its namespace (what ``ip netns pids <ns> | xargs
    kill -9`` does). Returns the pids killed."""
    pids = ns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def teardown(hosts: list[NetnsHost] | None = None) -> list[int]:
    """Kill every process in the harness's namespaces, delete them, their veths and the bridge.
    Safe to call any time, as often as wanted. Returns the pids it killed."""
    killed = []
    for h in hosts or []:
        if h.agent is not None and h.agent.poll() is None:
            h.agent.kill()
    for ns in namespaces():
        killed += kill_host(ns)
    deadline = time.monotonic() + 10
    for ns in namespaces():
        while ns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)  # deleting it deletes its veth and the peer
    for h in hosts or []:
        if h.agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.agent.wait(5)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == BRIDGE or (name.startswith("fgh") and name[3:].isdigit()):
            _ip("link", "del", name, check=False)
    return killed


def setup(n: int) -> list[NetnsHost]:
    """Create ``n`` hosts (namespaces ``forgeh1..n``) on the bridge; idempotent."""
    if not 1 <= n <= 50:
        raise ValueError(f"hosts must be between 1 and 50, got {n}")
    teardown()
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        hosts = []
        for i in range(1, n + 1):
            ns, veth, ip = f"{PREFIX}{i}", f"fgh{i}", f"{SUBNET}.{i + 1}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", BRIDGE)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", f"{SUBNET}.1")
            hosts.append(NetnsHost(ns, ip))
    except BaseException:
        teardown()
        raise
    return hosts


MONARCH_PORT = 4444


def start_monarch_worker(host: NetnsHost, log: str | Path) -> None:
    """Start Monarch's worker loop (``run_worker_loop_forever``) in ``host``'s namespace on
    port 4444, for ``attach_to_workers``; returns once it accepts connections. Monarch 0.7.0
    serves it without authentication (``ca="trust_all_connections"``)."""
    import socket

    code = (
        "from monarch.actor import run_worker_loop_forever; "
        f"run_worker_loop_forever(ca='trust_all_connections', address='tcp://{host.ip}:{MONARCH_PORT}')"
    )
    with open(log, "ab") as out:
        host.agent = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and host.agent.poll() is None:
        try:
            socket.create_connection((host.ip, MONARCH_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"Monarch worker in namespace {host.ns} did not start; see {log}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.multihost.netns", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create the hosts (namespaces on the bridge)")
    up.add_argument("--hosts", type=int, default=2)
    sub.add_parser("down", help="remove every namespace, link and process of the harness")
    sub.add_parser("status", help="list the hosts and their processes")
    kill = sub.add_parser("kill", help="SIGKILL every process in one host's namespace")
    kill.add_argument("ns")
    args = p.parse_args(argv)
    if args.cmd in ("up", "down") and (why := unavailable_reason()):
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if args.cmd == "up":
        for h in setup(args.hosts):
            print(h.ns, h.ip)
    elif args.cmd == "down":
        killed = teardown()
        print(f"removed the hosts; killed {len(killed)} process(es)")
    elif args.cmd == "status":
        for ns in namespaces():
            print(ns, "pids:", " ".join(map(str, ns_pids(ns))) or "-")
    else:
        print("killed:", " ".join(map(str, kill_host(args.ns))) or "nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
