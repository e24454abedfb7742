"""Where the Ray backend puts a service replica (``controller._ray.choose_node``: a node with
room, spread among those). The placement on a real cluster (a head node with CPUs, hosts
that share nothing) is tested in tests/multihost/test_ray_cluster.py."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'forge[ray]')")

from controller._ray import choose_node  # noqa: E402
from controller.errors import SpawnError  # noqa: E402


def node(i: int, cpus: float) -> dict:
    return {
        "NodeID": f"n{i}" + "0" * 12,
        "NodeManagerAddress": f"10.0.0.{i}",
        "Resources": {"CPU": cpus},
    }


HEAD, A, B = node(1, 9.0), node(2, 4.0), node(3, 4.0)
NEED = {"CPU": 1.0}


def test_a_full_node_is_passed_over_even_with_the_fewest_replicas():
    # the head is first in order and holds no replica, but its CPUs are taken (the run's
    # single actors): the replica goes to a worker node with room
    free = {HEAD["NodeID"]: {"CPU": 0.0}, A["NodeID"]: {"CPU": 3.0}, B["NodeID"]: {"CPU": 4.0}}
    load = {A["NodeID"]: 1}
    assert choose_node([HEAD, A, B], free, load, NEED) == (B["NodeID"], "")


def test_replicas_spread_among_the_nodes_with_room():
    free = {n["NodeID"]: {"CPU": 2.0} for n in (HEAD, A, B)}
    load = {HEAD["NodeID"]: 1, A["NodeID"]: 0, B["NodeID"]: 1}
    assert choose_node([HEAD, A, B], free, load, NEED) == (A["NodeID"], "")
    load[A["NodeID"]] = 1  # a tie: node order
    assert choose_node([HEAD, A, B], free, load, NEED) == (HEAD["NodeID"], "")
    # room for a fraction of a CPU is not room for a whole one; GPUs count too
    free[HEAD["NodeID"]] = {"CPU": 0.5}
    assert choose_node([HEAD, A, B], free, load, NEED)[0] == A["NodeID"]
    need = {"CPU": 1.0, "GPU": 1.0}
    free[B["NodeID"]] = {"CPU": 1.0, "GPU": 1.0}
    assert choose_node([HEAD, A, B], free, load, need) == (B["NodeID"], "")


def test_no_room_anywhere_names_the_node_and_why_it_is_full():
    free = {HEAD["NodeID"]: {"CPU": 0.0}, A["NodeID"]: {"CPU": 0.5}}
    got, why = choose_node([HEAD, A], free, {HEAD["NodeID"]: 0, A["NodeID"]: 1}, NEED)
    assert got == HEAD["NodeID"]
    assert why == (
        "no live node has room: node n10000000000 (10.0.0.1) has {'CPU': 0.0} free of "
        "{'CPU': 9.0} and the replica needs {'CPU': 1.0}"
    )
    with pytest.raises(SpawnError, match="no live node with CPUs"):
        choose_node([], {}, {}, NEED)
