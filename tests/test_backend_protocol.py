"""Every backend takes what the steps pass it: the Backend protocol's methods, each with every
parameter the protocol names (a backend merged without `made_for` failed every convert with a
TypeError), and the attributes the build asks without importing it agree with the class."""
import importlib
import inspect

import pytest

from hexbundle import backends
from hexbundle.backends import MARKING_BACKENDS, Backend
from hexbundle.backends.registry import _BACKENDS

PROTOCOL_METHODS = [name for name, value in vars(Backend).items()
                    if callable(value) and not name.startswith("_")]
PROTOCOL_ATTRIBUTES = [name for name in Backend.__annotations__]


def backend_class(name: str):
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)


def parameters(function) -> list:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize("name", sorted(_BACKENDS))
def test_every_backend_takes_every_parameter_the_protocol_names(name):
    cls = backend_class(name)
    assert PROTOCOL_METHODS and "convert" in PROTOCOL_METHODS and "compile" in PROTOCOL_METHODS
    for method in PROTOCOL_METHODS:
        assert hasattr(cls, method), f"{name}: no {method}()"
        assert parameters(getattr(cls, method)) == parameters(getattr(Backend, method)), \
            (name, method, parameters(getattr(cls, method)), parameters(getattr(Backend, method)))
    for attribute in PROTOCOL_ATTRIBUTES:
        assert hasattr(cls, attribute), f"{name}: no {attribute}"


@pytest.mark.parametrize("name", sorted(_BACKENDS))
def test_what_the_build_knows_of_a_backend_without_importing_it_is_the_class(name):
    cls = backend_class(name)
    assert cls.marks_outputs == (name in MARKING_BACKENDS)
    assert cls.name == name
    assert backends.describe(name)[1] == cls.deployable
