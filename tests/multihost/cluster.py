"""A Ray cluster of simulated hosts that share nothing but a network.

Each host is a network namespace (``tests/multihost/netns.py``: ``forgeh<i>``, address
``10.77.0.<i+1>`` on the bridge ``forgebr0``) *and* a mount namespace of its own with a private
``/dev/shm`` and ``/tmp`` (fresh tmpfs mounts), so nothing written there by one host is seen by
another or by the controller. The Ray head runs in the root namespace beside the controller
(``10.77.0.1``; no CPUs by default, so ranks never land on the controller's host, or with
CPUs: ``head_cpus``) and a Ray worker node runs in each host. Every node and the controller
use Ray token authentication (``RAY_AUTH_MODE=token``) with one random token, and the head's
health check declares a silent node dead in about 6 s (``controller._ray.HEALTH``). What
still is shared: the kernel (one pid space, so a pid seen here is the same process) and the
disk outside ``/tmp`` (the Python environment and the repository, at the same paths, as on a
cluster with one image).

Command line (as root)::

    python -m tests.multihost.cluster up --hosts 3   # prints the environment; Ctrl-C ends it
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.multihost import netns

REPO = netns.REPO
HEAD_IP = f"{netns.SUBNET}.1"
HEAD_PORT = 6380
NODE_CPUS = 8  # logical CPU slots per host (Forge ranks mostly wait)
START_TIMEOUT_S = 90.0
HEALTH = {  # as controller._ray.HEALTH (a node that stops answering is dead in ~6 s)
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}


@dataclass
class RayCluster:
    """The head (in the root namespace) and one worker node per simulated host."""

    hosts: list[netns.NetnsHost]
    token: str
    temp_dir: str
    log_dir: Path
    head: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{HEAD_PORT}"

    def env(self) -> dict[str, str]:
        """What a controller needs to join the cluster (with ``FORGE_BACKEND=ray``)."""
        return {
            "FORGE_BACKEND": "ray",
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
        }

    def host(self, ip: str) -> netns.NetnsHost:
        return next(h for h in self.hosts if h.ip == ip)

    def start_node(self, host: netns.NetnsHost) -> None:
        """Start (or restart) ``host``'s Ray worker node in its private mounts."""
        _start_node(self, host)

    def link(self, host: netns.NetnsHost, up: bool) -> None:
        """Take ``host``'s network link down (nothing is killed: a silent host) or up."""
        veth = f"fgh{host.ns[len(netns.PREFIX) :]}"
        subprocess.run(["ip", "link", "set", veth, "up" if up else "down"], check=True)


def _ray_bin() -> str:
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    if not os.path.exists(ray):
        raise RuntimeError("the `ray` command is not installed: pip install 'forge[ray]'")
    return ray


def _base_env(token: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "FORGE_BACKEND"):
        env.pop(k, None)
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = token
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _start_head(cluster: RayCluster, head_cpus: int | None = 0) -> None:
    cpus = [] if head_cpus is None else [f"--num-cpus={head_cpus}"]  # None: Ray's default
    cmd = [
        _ray_bin(),
        "start",
        "--head",
        f"--node-ip-address={HEAD_IP}",
        f"--port={HEAD_PORT}",
        *cpus,
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--block",
        f"--temp-dir={cluster.temp_dir}",
        f"--system-config={json.dumps(HEALTH)}",
    ]
    log = cluster.log_dir / "ray-head.log"
    with open(log, "ab") as out:
        cluster.head = subprocess.Popen(
            cmd,
            env=_base_env(cluster.token),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and cluster.head.poll() is None:
        probe = subprocess.run(
            [_ray_bin(), "status", f"--address={cluster.address}"],
            capture_output=True,
            env=_base_env(cluster.token),
            timeout=60,
        )
        if probe.returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Ray head did not start within {START_TIMEOUT_S:.0f} s; see {log}")


def session_pids(sid: int) -> list[int]:
    """Every process in session ``sid`` (``/proc/<pid>/stat`` field 6)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def stop_head(cluster: RayCluster) -> None:
    """Kill every process of the head's session (``ray start`` and what it started)."""
    if cluster.head is not None:
        for pid in session_pids(cluster.head.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cluster.head.wait(10)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def _start_node(cluster: RayCluster, host: netns.NetnsHost) -> None:
    ray = shlex.join(
        [
            _ray_bin(),
            "start",
            f"--address={cluster.address}",
            f"--node-ip-address={host.ip}",
            f"--num-cpus={NODE_CPUS}",
            "--disable-usage-stats",
            "--block",
        ]
    )
    private = f"mount -t tmpfs none /dev/shm && mount -t tmpfs none /tmp && exec {ray}"
    log = cluster.log_dir / f"ray-{host.ns}.log"
    with open(log, "ab") as out:
        host.agent = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.ns,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                private,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_base_env(cluster.token),
            cwd="/",
            start_new_session=True,
        )
    _wait_nodes(cluster, {host.ip}, log)


_NODES = (
    "import json, ray; ray.init(address={addr!r}, log_to_driver=False, logging_level='ERROR'); "
    "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]))"
)


def alive_node_ips(cluster: RayCluster) -> set[str]:
    """The IPs of the worker nodes the head counts as alive (``ray.nodes()`` from a short-lived
    driver)."""
    out = subprocess.run(
        [sys.executable, "-c", _NODES.format(addr=cluster.address)],
        capture_output=True,
        text=True,
        env=_base_env(cluster.token),
        timeout=60,
    )
    if out.returncode != 0:
        return set()
    return set(json.loads(out.stdout.strip().splitlines()[-1])) - {HEAD_IP}


def _wait_nodes(cluster: RayCluster, ips: set[str], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ips <= alive_node_ips(cluster):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"Ray nodes {sorted(ips)} did not join within {START_TIMEOUT_S:.0f} s; see {log}"
    )


@contextlib.contextmanager
def running_cluster(n: int, log_dir: str | Path, head_cpus: int | None = 0):
    """A head and ``n`` worker hosts; everything is removed on exit, whatever happened.
    ``head_cpus``: the head's CPUs (0: none, so ranks go to the hosts; ``None``: what a plain
    ``ray start --head`` gives, every CPU of the machine)."""
    token = secrets.token_hex(16)
    temp_dir = f"/tmp/forge-ray-head-{os.getpid()}"
    cluster = RayCluster([], token, temp_dir, Path(log_dir))
    try:
        cluster.hosts = netns.setup(n)
        _start_head(cluster, head_cpus)
        for h in cluster.hosts:
            _start_node(cluster, h)
        yield cluster
    finally:
        netns.teardown(cluster.hosts)
        stop_head(cluster)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.multihost.cluster", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the head and the hosts' Ray nodes")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--log-dir", default="/var/tmp")
    up.add_argument("--head-cpus", default="0", help="the head's CPUs; 'default': Ray's default")
    sub.add_parser("down", help="remove the hosts and stop the head")
    args = p.parse_args(argv)
    if why := netns.unavailable_reason():
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if args.cmd == "up":
        head_cpus = None if args.head_cpus == "default" else int(args.head_cpus)
        with running_cluster(args.hosts, args.log_dir, head_cpus) as cluster:
            for k, v in cluster.env().items():
                print(f"export {k}={v}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()  # up until Ctrl-C
    else:
        netns.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
