"""The order in which pytest-xdist's workers get the test files (tests/conftest.py): the
groups expected to take longest first, a group's tests in their own order."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HERE, UNKNOWN_COST_S, longest_first


class Item:
    def __init__(self, rel: str, name: str):
        self.path, self.name = HERE / rel, name

    def __repr__(self) -> str:
        return self.name


def test_longest_groups_first_and_each_group_in_its_own_order():
    calc = Item("e2e/apps/test_calc_app.py", "calc")
    ray = [Item("multihost/test_ray.py", f"ray{i}") for i in range(2)]
    netns = Item("multihost/test_netns.py", "netns")
    unit = [Item("unit/test_x.py", f"unit{i}") for i in range(3)]
    new = Item("e2e/apps/test_new.py", "new")  # not in the costs: UNKNOWN_COST_S
    items = [*unit, ray[0], netns, ray[1], new, calc]
    groups = {it: "multihost" if "multihost" in str(it.path) else str(it.path) for it in items}
    known = {"e2e/apps/test_calc_app.py": 300.0, "multihost/test_ray.py": 100.0,
             "multihost/test_netns.py": 150.0, "unit/test_x.py": UNKNOWN_COST_S / 2}  # fmt: skip
    longest_first(items, groups, known)
    # multihost/ is one group of 250 s: after the 300 s demo, its tests in collected order
    assert [it.name for it in items] == [
        "calc", "ray0", "netns", "ray1", "new", "unit0", "unit1", "unit2",
    ]  # fmt: skip


def test_the_costs_file_names_files_that_exist():
    import json

    known = json.loads((HERE / "costs.json").read_text())
    assert known, "tests/costs.json is empty"
    missing = [f for f in known if not (HERE / f).exists()]
    # A moved or deleted file only costs the order; many mean the file wants refreshing.
    assert len(missing) <= len(known) // 10, missing
    assert all(isinstance(v, (int, float)) and v >= 0 for v in known.values())
    assert Path(HERE / "costs.json").read_text().endswith("\n")
