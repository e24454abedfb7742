"""Monarch's own multi-host path on the simulated hosts (network namespaces): Monarch's worker
loop in each namespace, ``attach_to_workers`` in the controller. Monarch 0.7.0 stays a
single-host backend for Forge's failure handling (docs/multihost.md says why); Forge across
hosts runs on Ray (``tests/multihost/test_ray_cluster.py``). Run as root:
``python -m pytest -q -m multihost``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env, write_script
from tests.multihost import netns

pytestmark = pytest.mark.timeout(300)

H1, H2 = "10.77.0.2", "10.77.0.3"


@pytest.mark.monarch
@pytest.mark.skipif(importlib.util.find_spec("monarch") is None, reason="needs torchmonarch")
def test_monarch_backend_on_a_host_mesh_spanning_namespaces(monarch_hosts, tmp_path):
    """Monarch's own multi-host path: worker loops in the namespaces, ``attach_to_workers`` in
    the controller (a fresh process: Monarch's transport must be chosen before first use)."""
    workers = [f"tcp://{h.ip}:{netns.MONARCH_PORT}" for h in monarch_hosts]
    script = write_script(
        tmp_path,
        f"""
        import asyncio
        from monarch.actor import attach_to_workers, enable_transport

        enable_transport("tcp://{netns.SUBNET}.1:0")  # default: unix sockets, per namespace

        from controller import shutdown, use_host_mesh
        from tests.multihost.actors import Where

        async def main():
            hm = attach_to_workers(ca="trust_all_connections", workers={workers!r})
            await asyncio.wait_for(hm.initialized, 60)
            use_host_mesh(hm)
            m = await Where.options(hosts=2, env_vars={{"GLOO_SOCKET_IFNAME": "eth0"}}).as_actor()
            print("IPS", *[w["ip"] for w in (await m.where.call()).values()])
            other, _ = await m.slice(hosts=0).call_other.call_one(m.slice(hosts=1), 7)
            print("CROSS", other["ip"])
            print("REDUCE", *(await m.all_reduce.call(1.5)).values())
            await shutdown()

        asyncio.run(main())
        """,
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=script_env(FORGE_BACKEND="monarch"),
        cwd=REPO,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"IPS {H1} {H2}" in out.stdout
    assert f"CROSS {H2}" in out.stdout
    assert "REDUCE 3.0 3.0" in out.stdout
