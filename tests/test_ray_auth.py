"""Connecting to a Ray cluster whose ``ray start --head`` turned token authentication on
(``dse.engine.token_auth_needed``): the driver turns it on too where Ray's token is, leaves a mode
set either way alone, and a connection that still fails is one line naming RAY_AUTH_MODE=token.
No cluster is started: ``ray.init`` is replaced."""

import os

import pytest

from tvm_dsa.dse import engine as dse_engine
from tvm_dsa.dse.engine import token_auth_needed


def test_the_token_file_in_home_turns_token_auth_on(tmp_path):
    assert not token_auth_needed({"HOME": str(tmp_path)})
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)
    assert token_auth_needed({"HOME": str(tmp_path)})
    # a mode set either way is the user's
    assert not token_auth_needed({"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"})
    assert not token_auth_needed({"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"})


def test_a_token_in_the_environment_or_at_its_path_turns_it_on(tmp_path):
    empty = {"HOME": str(tmp_path)}
    assert token_auth_needed(empty | {"RAY_AUTH_TOKEN": "abc"})
    token = tmp_path / "elsewhere"
    assert not token_auth_needed(empty | {"RAY_AUTH_TOKEN_PATH": str(token)})  # no file there
    token.write_text("abc")
    assert token_auth_needed(empty | {"RAY_AUTH_TOKEN_PATH": str(token)})


def test_ray_engine_sets_the_mode_before_connecting_and_fails_in_one_line(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(dse_engine, "_enable_token_auth", lambda: os.environ.__setitem__("RAY_AUTH_MODE", "token"))
    seen = []

    def refused(address, **_):
        seen.append((address, os.environ.get("RAY_AUTH_MODE")))
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")

    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(ConnectionError) as err:
        with dse_engine.ray_engine("127.0.0.1:6379", 1):
            pass
    assert seen == [("127.0.0.1:6379", "token")]
    message = str(err.value)
    assert "\n" not in message and "RAY_AUTH_MODE=token" in message and "127.0.0.1:6379" in message
