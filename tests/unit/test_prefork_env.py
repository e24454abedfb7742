"""Which environment differences a zygote forked from the controller can take on after the
fork (``controller._prefork._applied``), by hand."""

from controller._prefork import _applied

MINE = {"HOME": "/root", "PATH": "/bin", "PYTHONPATH": "/repo"}


def test_the_actor_variables_are_applied_after_the_fork():
    child = {
        **MINE,
        "PYTHONPATH": "/forge:/repo",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    assert _applied(child, MINE) == {
        "PYTHONPATH": "/forge:/repo",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    assert _applied(dict(MINE), MINE) == {}


def test_a_name_read_at_start_up_that_cannot_be_applied_refuses():
    assert _applied({**MINE, "PYTHONHASHSEED": "0"}, MINE) is None
    assert _applied({**MINE, "CUDA_VISIBLE_DEVICES": "1"}, MINE) is None
    assert _applied({"HOME": "/root", "PATH": "/bin"}, {**MINE, "LANG": "C"}) is None  # unset


def test_values_the_copy_could_not_reproduce_refuse():
    for name, value in (
        ("OMP_NUM_THREADS", "0"),
        ("OMP_NUM_THREADS", "two"),
        ("TRANSFORMERS_VERBOSITY", "loud"),
        ("PYTHONUNBUFFERED", ""),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "0"),
    ):
        assert _applied({**MINE, name: value}, MINE) is None, (name, value)
    # set in the controller, absent for the child: a fresh interpreter would not have it
    assert _applied(dict(MINE), {**MINE, "OMP_NUM_THREADS": "4"}) is None


def test_a_gpu_host_keeps_the_fresh_zygote(monkeypatch):
    from controller import _prefork

    for names, want in (
        (["null", "shm"], False),
        (["nvidia0", "nvidiactl"], True),
        (["kfd"], True),
    ):
        monkeypatch.setattr(_prefork.os, "listdir", lambda _d, n=names: n)
        assert _prefork._has_gpu_devices() is want, names
