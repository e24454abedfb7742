"""``forge serve``'s API key need not be on the command line (where every local user sees it
in ``ps``): it comes from ``FORGE_API_KEY`` or ``--api-key-file``, a file only its owner may
read; any other key file (readable or writable by anyone else, another user's, a link) is
refused naming the fix."""

from __future__ import annotations

import os

import pytest

from forge.cli.main import build_parser
from forge.serve.server import api_key_from

KEY = "tml-" + "k3yFromAFile0123456789abcdefXYZ"
NOBODY = 65534


def _key_file(tmp_path, mode: int = 0o600):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    os.chmod(path, mode)
    return path


def test_the_key_comes_from_a_private_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("FORGE_API_KEY", raising=False)
    for mode in (0o600, 0o400):
        assert api_key_from(None, str(_key_file(tmp_path, mode))) == KEY
    monkeypatch.setenv("FORGE_API_KEY", KEY)
    assert api_key_from(None) == KEY
    args = build_parser().parse_args(["serve", "--api-key-file", str(tmp_path / "key")])
    assert args.api_key_file == str(tmp_path / "key") and args.api_key is None
    with pytest.raises(ValueError, match="not both"):
        api_key_from(KEY, str(tmp_path / "key"))


@pytest.mark.parametrize("bit", [0o040, 0o020, 0o010, 0o004, 0o002, 0o001])
def test_a_key_file_anyone_else_may_touch_is_refused(tmp_path, bit):
    path = _key_file(tmp_path, 0o600 | bit)
    with pytest.raises(ValueError, match=f"other users may read or write it.*chmod 600 {path}"):
        api_key_from(None, str(path))


def test_a_linked_or_foreign_key_file_is_refused(tmp_path):
    path = _key_file(tmp_path)
    os.symlink(path, tmp_path / "link")
    with pytest.raises(ValueError, match="not a regular file"):
        api_key_from(None, str(tmp_path / "link"))
    with pytest.raises(ValueError, match="cannot read it"):
        api_key_from(None, str(tmp_path / "missing"))
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"belongs to uid {NOBODY}"):
        api_key_from(None, str(path))
