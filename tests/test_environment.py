"""environment.env_value answers exactly as os.environ.get, for set, unset, changed and removed
variables, non-ASCII values, and an os.environ replaced by a plain mapping."""
import os

from asmgemm.environment import env_value


def test_env_value_follows_os_environ(monkeypatch):
    name = "ASMGEMM_TEST_ENV_VALUE"
    monkeypatch.delenv(name, raising=False)
    assert env_value(name) is None and env_value(name, "d") == "d"
    monkeypatch.setenv(name, "1")
    assert env_value(name) == "1" == os.environ.get(name)
    os.environ[name] = "héllo wörld"
    assert env_value(name, "x") == "héllo wörld"
    os.environ[name] = ""
    assert env_value(name, "x") == ""            # set to empty is set, as for os.environ.get
    del os.environ[name]
    assert env_value(name, "gone") == "gone"


def test_env_value_on_a_replaced_environ(monkeypatch):
    monkeypatch.setattr(os, "environ", {"ASMGEMM_TEST_ENV_VALUE": "plain"})
    assert env_value("ASMGEMM_TEST_ENV_VALUE") == "plain"
    assert env_value("ASMGEMM_TEST_ENV_MISSING", "d") == "d"


def test_spec_version_and_tune_lookups_see_a_change_at_once(monkeypatch):
    from asmgemm.kernel_spec import specs_version
    from asmgemm.runtime.tune_cache import lookups_disabled, lookups_off
    monkeypatch.delenv("ASMGEMM_NO_TUNE_CACHE", raising=False)
    assert not lookups_disabled()
    with lookups_off():
        assert lookups_disabled()
    assert not lookups_disabled()
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "0")
    assert not lookups_disabled()
    monkeypatch.delenv("ASMGEMM_KERNEL_SPECS", raising=False)
    token = specs_version()
    assert specs_version() is token
    monkeypatch.setenv("ASMGEMM_KERNEL_SPECS", "/nonexistent/specs.toml")
    assert specs_version() is not token
