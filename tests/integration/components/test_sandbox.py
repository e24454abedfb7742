"""The Python sandbox runs real processes: output, timeouts, memory limit, no inherited
environment, truncation, and the python tool through a ToolSet."""

from __future__ import annotations

import os
import time

from forge.envs import ToolSet, python_tool, run_python
from forge.envs.tool_parser import ToolCall


def test_output_and_exit_code_are_captured():
    r = run_python("import sys\nprint('hello', 6 * 7)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert r.stdout == "hello 42\n" and r.stderr == "oops\n"
    assert r.exit_code == 3 and not r.timed_out and not r.truncated
    assert "[exit code 3]" in r.to_text()


def test_exceptions_show_the_traceback():
    r = run_python("1 / 0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr


def test_timeout_kills_the_process_group_in_time():
    code = "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    code += "while True: pass\n"
    start = time.monotonic()
    r = run_python(code, timeout_s=1.0)
    assert time.monotonic() - start < 2.0
    assert r.timed_out and r.exit_code == -9 and "[timed out]" in r.to_text()


def test_memory_bomb_fails_cleanly():
    r = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=128)
    assert not r.timed_out and r.exit_code != 0
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("FORGE_TEST_SECRET", "hunter2")
    r = run_python("import os\nprint(sorted(os.environ))\nprint(os.getcwd())")
    lines = r.stdout.splitlines()
    assert "FORGE_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert "HOME" not in lines[0] and "PATH" in lines[0]
    cwd = lines[1]
    assert os.path.basename(cwd).startswith("forge-sandbox-")
    assert not os.path.exists(cwd)  # the temporary working directory is gone


def test_output_is_truncated():
    r = run_python(
        "print('a' * 5000)\nimport sys\nsys.stderr.write('b' * 300 + 'END')", 5, 256, 100
    )
    assert r.truncated
    assert r.stdout.startswith("a" * 100 + "\n[... truncated to 100 characters of 5001 bytes")
    assert r.stderr.endswith("b" * 97 + "END") and r.stderr.startswith("[... truncated")


async def test_python_tool_runs_code_through_a_toolset():
    tools = ToolSet([python_tool(timeout_s=2.0)])
    assert tools.specs()[0]["function"]["parameters"]["required"] == ["code"]
    result = await tools.execute(ToolCall("python", {"code": "print(sum(range(10)))"}))
    assert result.ok and result.message == {"role": "tool", "content": "45\n", "name": "python"}
    result = await tools.execute(ToolCall("python", {"code": "raise ValueError('no')"}))
    assert result.ok and "ValueError: no" in result.message["content"]  # shown to the model
