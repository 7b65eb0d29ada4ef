"""hexbundle.graph in-process: the one action wrapper and the lazily computed up-to-date keys."""
import pytest
from doit.exceptions import TaskFailed

from hexbundle.graph.actions import action
from hexbundle.graph.keys import step_key
from hexbundle.support.errors import ConfigError


def run(act):
    fn, args, kwargs = act
    return fn(*args, **kwargs)


def test_a_library_error_becomes_task_failed_with_its_message():
    def fails(path):
        raise ConfigError(f"{path}: key 'x' is unknown")
    result = run(action(fails, "configs/build.toml"))
    assert isinstance(result, TaskFailed)
    assert "configs/build.toml: key 'x' is unknown" in str(result)


def test_success_and_task_params_reach_the_function():
    seen = {}

    def works(root, base="", network="none"):
        seen.update(root=root, base=base, network=network)
    fn, args, kwargs = action(works, "/project")
    assert fn(*args, base="ref", network="default", **kwargs) is True   # doit passes params
    assert seen == {"root": "/project", "base": "ref", "network": "default"}


def test_a_bug_is_not_hidden_as_a_task_failure():
    def buggy():
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        run(action(buggy))


def test_step_keys_call_callables_only_when_checked():
    calls = []

    def toolchain():
        calls.append(1)
        return "v1"
    key = step_key("convert", {"backend": "reference", "toolchain": toolchain})
    assert calls == []                              # making the task graph asks nothing
    text = key.text()
    assert calls == [1]
    key.text()
    assert calls == [1]                             # once per process
    assert text == step_key("convert", {"backend": "reference", "toolchain": "v1"}).text()
    assert text != step_key("convert", {"backend": "reference", "toolchain": "v2"}).text()
