"""Cross-host weight sync: a pushed version reaching generators on hosts that share nothing.

    sudo python -m benchmarks.relay [--hosts 4] [--repeats 3] [--mb 420] [--rate 1gbit]

Starts the Ray cluster of simulated hosts (``tests/multihost/cluster.py``: network namespaces
with private ``/dev/shm`` and ``/tmp``), then a ``Node`` actor on each host (a service spread
one replica per host). Node 0 pushes a version of ``--mb`` MB (fp32 tensors of a 0.44 GB
model's sizes by default) with the ``shm`` transport, as the trainer does; then, side by side
in one run and as medians over ``--repeats`` fresh pushes:

- **relay, 1 host**: ``forge.weights.relay.localize(handle)`` on node 1 (copy the version from
  the pusher into this host's ``/dev/shm``: what a generator does before mapping it);
- **relay, N hosts**: the same on nodes 1..N-1 at once (each host fetches once, in a chain:
  the first host to ask copies from the pusher, each later one from the host before it);
- **TCP floor, 1 host**: the same bytes over a plain TCP socket from node 0 to node 1
  (``sendfile`` of the shm file into ``recv_into`` a preallocated buffer), between the same
  network namespaces: the floor for moving them once;
- **TCP floor, N hosts**: node 0 sending to nodes 1..N-1 at once.

``--rate`` limits what each host sends (``tc`` ``tbf`` on its link), as a NIC would: the
simulated hosts share this machine's cores, so without it the copies are bound by the CPU,
not by any link, and moving the bytes once or three times costs the same. ``pusher_sent``:
bytes the pusher served per version, over the version's size.

The last line is machine-readable: ``relay_vs_tcp=<1 host ratio> relay_hosts_vs_one=<N hosts
over 1 host>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from controller import Actor, endpoint

SECTION = 64 << 20


class Node(Actor):
    """One per host: pushes (node 0) or pulls versions, and the raw-TCP floor."""

    def __init__(self):
        self.transport = None
        self.server: socket.socket | None = None

    @endpoint
    def host(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.77.0.1", 9))
            return s.getsockname()[0]

    @endpoint
    def push(self, version: int, mb: int):
        import torch

        from forge.weights.shm import SharedMemoryTransport

        if self.transport is None:
            self.transport = SharedMemoryTransport(f"bench-{os.getpid()}", spares=0)
        n = mb * (1 << 20) // 4
        sizes = [n // 8] * 7 + [n - 7 * (n // 8)]
        state = {f"w{i}": torch.full((k,), float(version)) for i, k in enumerate(sizes)}
        for v in self.transport.versions():
            self.transport.drop(v)
        return self.transport.push(state, version)

    @endpoint
    async def pull(self, handle) -> float:
        from forge.weights.relay import localize

        t0 = time.perf_counter()
        local = await localize(handle)
        took = time.perf_counter() - t0
        assert local.location != handle.location and os.path.exists(local.location)
        return took

    @endpoint
    def served(self, path: str) -> int:
        from controller import files

        return files.served_bytes(path)

    @endpoint
    def file_size(self, path: str) -> int:
        return os.path.getsize(path)

    @endpoint
    def serve_raw(self, path: str) -> int:
        """Listen on a plain TCP port; each connection gets ``path``'s bytes (sendfile)."""
        srv = socket.create_server((self.host(), 0))
        srv.listen(16)
        self.server = srv

        def loop():
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn, open(path, "rb") as f:
                    conn.sendfile(f)

        import threading

        threading.Thread(target=loop, daemon=True).start()
        return srv.getsockname()[1]

    @endpoint
    def recv_raw(self, ip: str, port: int, size: int) -> float:
        buf = bytearray(size)
        view = memoryview(buf)
        t0 = time.perf_counter()
        with socket.create_connection((ip, port)) as s:
            got = 0
            while got < size:
                k = s.recv_into(view[got:], min(SECTION, size - got))
                if not k:
                    raise ConnectionError(f"raw TCP copy ended at {got} of {size} bytes")
                got += k
        return time.perf_counter() - t0


async def bench(hosts: int, repeats: int, mb: int) -> dict:
    svc = await Node.options(num_replicas=hosts).as_service()
    nodes = [r.mesh for r in svc.replicas]
    ips = [await n.host.call_one() for n in nodes]
    assert len(set(ips)) == hosts, f"nodes share hosts: {ips}"
    pusher, pullers = nodes[0], nodes[1:]
    out: dict[str, list[float]] = {"relay_1": [], "relay_n": [], "tcp_1": [], "tcp_n": []}
    version = 0
    nbytes = 0
    for _ in range(repeats):
        for key, group in (("relay_1", pullers[:1]), ("relay_n", pullers)):
            version += 1
            handle = await pusher.push.call_one(version, mb)
            nbytes = handle.nbytes
            t0 = time.perf_counter()
            await asyncio.gather(*(p.pull.call_one(handle) for p in group))
            out[key].append(time.perf_counter() - t0)
            sent = await pusher.served.call_one(handle.location)
            out[f"sent_{key}"] = out.get(f"sent_{key}", []) + [sent / handle.nbytes]
        port = await pusher.serve_raw.call_one(handle.location)
        size = await pusher.file_size.call_one(handle.location)  # the file: header and all
        for key, group in (("tcp_1", pullers[:1]), ("tcp_n", pullers)):
            t0 = time.perf_counter()
            await asyncio.gather(*(p.recv_raw.call_one(ips[0], port, size) for p in group))
            out[key].append(time.perf_counter() - t0)
    return {"nbytes": nbytes, "hosts": hosts, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=4, help="simulated hosts (1 pusher + pullers)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mb", type=int, default=420, help="MB pushed (420 MiB = 0.44 GB)")
    p.add_argument("--rate", help="limit what each host sends, e.g. 1gbit (tc tbf)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # on the cluster
    a = p.parse_args()
    if a.child:
        result = asyncio.run(bench(a.hosts, a.repeats, a.mb))
        print("RESULT " + json.dumps(result), flush=True)
        return
    from tests.multihost.cluster import running_cluster

    logs = tempfile.mkdtemp(prefix="forge-relay-bench-", dir="/var/tmp")
    with running_cluster(a.hosts, logs) as cluster:
        env = {**os.environ, **cluster.env()}
        for h in cluster.hosts if a.rate else []:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.ns,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    a.rate,
                    "burst",
                    "1mb",
                    "latency",
                    "100ms",
                ],
                check=True,
            )
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.relay", *sys.argv[1:], "--child"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not line:
        sys.exit(f"benchmark failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    r = json.loads(line[-1][7:])
    gb = r["nbytes"] / 1e9
    med = {k: statistics.median(v) for k, v in r.items() if isinstance(v, list)}
    n = r["hosts"] - 1
    rate = f", each host sending at most {a.rate}" if a.rate else ""
    print(
        f"version of {gb:.2f} GB, pusher on 1 host, pullers on {n}{rate}, medians of "
        f"{len(r['relay_1'])} runs"
    )
    for key, label in (
        ("relay_1", "relay, 1 host"),
        ("tcp_1", "TCP floor, 1 host"),
        ("relay_n", f"relay, {n} hosts"),
        ("tcp_n", f"TCP floor, {n} hosts"),
    ):
        runs = " ".join(f"{x:.2f}" for x in r[key])
        print(
            f"{label:22s} median {med[key]:6.2f} s  ({gb / med[key]:.2f} GB/s per host)  runs {runs}"
        )
    print(
        f"pusher_sent: {med['sent_relay_1']:.2f}x the version for 1 host, "
        f"{med['sent_relay_n']:.2f}x for {n} hosts"
    )
    print(
        f"relay_vs_tcp={med['relay_1'] / med['tcp_1']:.2f} "
        f"relay_hosts_vs_one={med['relay_n'] / med['relay_1']:.2f} "
        f"tcp_hosts_vs_one={med['tcp_n'] / med['tcp_1']:.2f}"
    )


if __name__ == "__main__":
    main()
