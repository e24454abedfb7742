"""scripts/test_timings.py: the CI timings table, per folder and the slowest tests."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("test_timings", REPO / "scripts/test_timings.py")
assert spec is not None and spec.loader is not None
timings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timings)

REPORT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.e2e.apps.test_calc_app" name="test_learns@tests/e2e/apps/x" time="500.5"/>
<testcase classname="tests.unit.test_a" name="test_quick" time="0.25"/>
<testcase classname="tests.unit.test_a" name="test_broken" time="2"><failure/></testcase>
<testcase classname="tests.e2e.apps.test_guess_app" name="test_guess" time="140"><skipped/></testcase>
</testsuite></testsuites>"""


def test_folders_and_the_slowest_tests(tmp_path, capsys):
    path = tmp_path / "r.xml"
    path.write_text(REPORT)
    assert timings.main([str(path), "--step", "slow=600", "--slowest", "2"]) == 0
    out = capsys.readouterr().out
    assert "| e2e/apps | 2 | 1 | 0 | 640 |" in out
    assert "| unit | 2 | 0 | 1 | 2 |" in out
    assert "| total | 600 | 10.0 |" in out
    slow = out[out.index("| slowest tests") :].splitlines()
    # longest first, the xdist group suffix dropped, only the two asked for
    assert slow[2:] == [
        "| e2e/apps/test_calc_app::test_learns | 500 |",
        "| e2e/apps/test_guess_app::test_guess | 140 |",
    ]


def test_no_reports_no_slowest_table(capsys):
    assert timings.main(["--step", "setup=30"]) == 0
    assert "slowest" not in capsys.readouterr().out
