"""A running ``forge serve`` under hostile requests: malformed and oversized bodies, zstd
bombs, traversal paths, weak keys, a public bind. Each case asserts the answer (400 naming
the field, 413), that the server keeps serving and spawned nothing for a refused request,
that nothing was written outside its directory, and (``serve_process``) that no process
outlives it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("zstandard")

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.helpers import REPO, script_env, wait_dead  # noqa: E402
from tests.serve_process import TOY, serve_process, stop_server  # noqa: E402

KEY = "tml-hostile-key-0123456789abcdefgh"
H = {"X-API-Key": KEY}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("serve")
    cfg = TOY + (
        f"dir: {work / 'ckpt'}\nmax_body_bytes: 1048576\n"
        "max_decompressed_bytes: 4194304\nmax_samples: 8\n"
    )
    with serve_process(work, cfg, KEY) as url:
        yield url, work
    log = (work / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def _children(pid: int) -> set[int]:
    return {c.pid for c in psutil.Process(pid).children(recursive=True)}


def _session(url: str) -> str:
    return httpx.post(f"{url}/api/v1/create_session", json={}, headers=H).json()["session_id"]


def test_malformed_bodies_get_400_naming_the_field(server, tmp_path):
    url, work = server
    before = _children(url.pid)
    sid = _session(url)
    tiny = {"base_model": "forge/tiny", "prompt": {"chunks": [{"tokens": [5, 9]}]}}
    cases = [
        ("session_heartbeat", {}, "field 'session_id' is required"),
        ("session_heartbeat", {"session_id": 5}, "field 'session_id' must be a string"),
        (
            "create_model",
            {
                "session_id": sid,
                "base_model": "forge/tiny",
                "model_seq_id": "0/../../../../" + str(tmp_path / "x"),
            },
            "field 'model_seq_id' must be an integer",
        ),
        (
            "create_model",
            {"session_id": sid, "base_model": ["forge/tiny"], "model_seq_id": 0},
            "field 'base_model' must be a string",
        ),
        ("optim_step", {"model_id": "../x"}, "field 'model_id' must be a plain name"),
        ("optim_step", {"model_id": "m", "adam_params": {"learning_rate": "fast"}}, "unknown"),
        ("asample", {**tiny, "num_samples": 9}, "field 'num_samples' must be an integer in 1..8"),
        ("asample", {**tiny, "num_samples": 10**12}, "'num_samples'"),
        (
            "asample",
            {**tiny, "sampling_params": {"max_tokens": 10**9}},
            "field 'sampling_params.max_tokens' must be an integer in 1..2046",
        ),
        (
            "asample",
            {**tiny, "sampling_params": {"stop": ["x"] * 100}},
            "'sampling_params.stop' must hold at most 16",
        ),
        (
            "asample",
            {**tiny, "sampling_params": {"temperature": "hot"}},
            "'sampling_params.temperature'",
        ),
        ("asample", {**tiny, "prompt": {"chunks": [{"tokens": [-1]}]}}, "token ids"),
        (
            "asample",
            {**tiny, "prompt": {"chunks": [{"tokens": list(range(3000))}]}},
            "over the base model's max_context_length of 2048",
        ),
        ("asample", {"base_model": "gpt-5", "prompt": tiny["prompt"]}, "not served here"),
        ("retrieve_future", {"request_id": {"$gt": ""}}, "field 'request_id' must be a string"),
    ]
    for route, body, expect in cases:
        r = httpx.post(f"{url}/api/v1/{route}", json=body, headers=H)
        assert r.status_code == 400, (route, body, r.status_code, r.text)
        assert expect in r.json()["detail"], (route, r.json()["detail"])
    for raw, expect in [
        (b"{not json", "the body is not JSON"),
        (b"[1, 2]", "a JSON object"),
        (b"\xff\xfe", "the body is not JSON"),
    ]:
        r = httpx.post(f"{url}/api/v1/create_session", content=raw, headers=H)
        assert r.status_code == 400 and expect in r.json()["detail"], r.text
    r = httpx.post(f"{url}/api/v1/forward_backward", content=b"\x0a\xff", headers=H)
    assert r.status_code == 400 and "not a ForwardBackwardRequest" in r.json()["detail"]
    assert not (tmp_path / "x").exists()
    assert _children(url.pid) == before, "a refused request spawned processes"
    assert httpx.get(f"{url}/api/v1/healthz", headers=H).json() == {"status": "ok"}


def test_oversized_bodies_and_zstd_bombs_get_413(server):
    import zstandard

    url, _ = server
    big = b"{" + b" " * (2 << 20) + b"}"
    r = httpx.post(f"{url}/api/v1/create_session", content=big, headers=H)
    assert r.status_code == 413 and "serve.max_body_bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: refused once the stream passes the cap
        for _ in range(64):
            yield b" " * 65536

    r = httpx.post(f"{url}/api/v1/create_session", content=chunks(), headers=H)
    assert r.status_code == 413, r.text
    # 1 GiB of zeros in a few kilobytes: the server stops at its cap (4 MiB) and says so.
    comp = zstandard.ZstdCompressor(level=19).compressobj()
    bomb = b"".join(comp.compress(b"\0" * (1 << 20)) for _ in range(1024)) + comp.flush()
    assert len(bomb) < (1 << 20)
    rss = psutil.Process(url.pid).memory_info().rss
    t0 = time.monotonic()
    r = httpx.post(
        f"{url}/api/v1/forward_backward", content=bomb, headers={**H, "Content-Encoding": "zstd"}
    )
    assert r.status_code == 413 and "serve.max_decompressed_bytes" in r.json()["detail"]
    assert time.monotonic() - t0 < 10
    assert psutil.Process(url.pid).memory_info().rss < rss + (256 << 20)
    r = httpx.post(
        f"{url}/api/v1/forward_backward",
        content=b"not zstd",
        headers={**H, "Content-Encoding": "zstd"},
    )
    assert r.status_code == 400 and "not valid zstd" in r.json()["detail"]
    assert httpx.get(f"{url}/api/v1/healthz", headers=H).status_code == 200


def test_checkpoint_paths_stay_in_the_server_directory(server, tmp_path):
    url, work = server
    sid = _session(url)
    ckpt = work / "ckpt"
    ckpt.mkdir(exist_ok=True)
    # A checkpoint-looking directory outside, and a link to it inside the server's directory.
    outside = tmp_path / "outside" / "c"
    outside.mkdir(parents=True)
    (outside / "forge_serve.json").write_text(
        json.dumps({"base_model": "forge/tiny", "lora_config": {}})
    )
    os.symlink(tmp_path / "outside", ckpt / "linked:train:0")
    (work / "weights" / "x").mkdir(parents=True)  # what tinker://../weights/x used to reach
    (work / "weights" / "x" / "forge_serve.json").write_text("{}")
    cases = [
        ("tinker://../weights/x", "is not a model id"),
        ("tinker://./weights/x", "is not a model id"),
        ("tinker://a/weights/..", "checkpoint name '..'"),
        ("tinker://linked:train:0/weights/c", "outside this server's directory"),
        ("tinker://a/b/weights/x", "is not a tinker://"),
    ]
    for path, expect in cases:
        body = {"path": path, "session_id": sid, "model_seq_id": 1, "optimizer": True}
        r = httpx.post(f"{url}/api/v1/load_weights", json=body, headers=H)
        assert r.status_code == 400 and expect in r.json()["detail"], (path, r.text)
    r = httpx.post(
        f"{url}/api/v1/save_weights", json={"model_id": "../../x", "path": "p"}, headers=H
    )
    assert r.status_code == 400
    assert sorted(p.name for p in ckpt.iterdir()) == ["linked:train:0"]  # nothing written


class _Planted:
    """Unpickling this runs ``touch <marker>``: what a planted optimizer state could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_optimizer_state_is_refused_and_the_client_goes_on(server, tmp_path):
    import shutil

    import tinker
    import torch
    from tinker import types

    url, work = server
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:  # closed at the end: its heartbeat thread would outlive the server otherwise
        tc = service.create_lora_training_client(base_model="forge/tiny", rank=4).result()
        d = types.Datum(
            model_input=types.ModelInput.from_ints([5, 9, 13]),
            loss_fn_inputs={"target_tokens": [9, 13, 21], "weights": [1.0] * 3},
        )
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        good = tc.save_state("good").result().path
        # Someone with write access to the checkpoints plants a pickle in a copy.
        model_dir = work / "ckpt" / good.split("/")[2]
        shutil.copytree(model_dir / "good", model_dir / "planted")
        marker = tmp_path / "pwned"
        torch.save({"optimizer": _Planted(str(marker))}, model_dir / "planted" / "trainer_state.pt")
        with pytest.raises(tinker.RequestFailedError, match="not loaded.*posix.system"):
            tc.load_state_with_optimizer(good.replace("/good", "/planted")).result()
        assert not marker.exists(), "the planted pickle ran"
        tc.load_state_with_optimizer(good).result()  # the client and its checkpoints still work
        assert tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"] is not None
    finally:
        service.close("success").result(timeout=60)


def test_a_weak_key_is_refused_and_says_what_is_weak(tmp_path):
    for key, expect in [
        ("tml-short", "has 5 characters"),
        ("tml-" + "ab" * 20, "2 distinct"),
        ("secret", "must start with 'tml-'"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "forge.cli", "serve", "--port", "0", "--api-key", key],
            cwd=str(REPO),
            env=script_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and expect in out.stderr, (key, out.stderr)


def test_binding_off_loopback_warns(tmp_path):
    (tmp_path / "serve.yaml").write_text(TOY + f"dir: {tmp_path / 'ckpt'}\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--api-key",
            KEY,
            "--config",
            str(tmp_path / "serve.yaml"),
        ],
        cwd=str(REPO),
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if re.search(r"Tinker API on http://", line):
                break
        text = "".join(lines)
        assert "not a loopback address" in text and "TLS" in text, text
    finally:
        children = stop_server(proc)
    assert not wait_dead(children + [proc.pid], 30)


def test_silent_and_slow_connections_are_dropped_and_bounded(tmp_path):
    import socket

    cfg = TOY + f"dir: {tmp_path / 'ckpt'}\nheader_timeout_s: 1.0\nmax_connections: 4\n"
    with serve_process(tmp_path, cfg, KEY) as url:
        host, port = url.removeprefix("http://").split(":")
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(4)]
        # The connection slots are full of silent peers: a real request still gets one (the
        # oldest silent connection is closed for it).
        r = httpx.get(f"{url}/api/v1/healthz", headers=H)
        assert r.status_code == 200, r.text
        slow = socket.create_connection((host, int(port)), timeout=10)
        t0 = time.monotonic()
        for s in silent:
            assert s.recv(1) == b""  # closed by the server after header_timeout_s
        assert time.monotonic() - t0 < 5
        try:  # a slow loris: one byte of the request head every 0.2 s
            for b in b"GET /api/v1/healthz HTTP/1.1\r\nHost: x\r\n":
                slow.sendall(bytes([b]))
                time.sleep(0.2)
            assert slow.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while it was still sending
        for s in [*silent, slow]:
            s.close()
        assert httpx.get(f"{url}/api/v1/healthz", headers=H).json() == {"status": "ok"}
