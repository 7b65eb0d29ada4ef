"""Which module and class each backend name means, and the one place that imports them.

Kept out of the package's __init__: a module naming `importlib.import_module` covers, in a step's
code key (graph.codekey), every backend module it names by string, and every module of
hexbundle.backends runs the __init__. Here only the steps that pick a backend by name (convert,
compile, bundle and the checks of fetched outputs) carry all three backends in their key; verify,
which runs the ortqnn simulator, carries that backend alone.
"""
from __future__ import annotations

import importlib

from hexbundle.backends import Backend
from hexbundle.support.errors import BackendError

# name -> (module, class); modules are imported only when that backend is asked for.
_BACKENDS = {
    "reference": ("hexbundle.backends.reference", "ReferenceBackend"),
    "qairt": ("hexbundle.backends.qairt", "QairtBackend"),
    "ortqnn": ("hexbundle.backends.ortqnn", "OrtQnnBackend"),
}


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose reference, qairt or ortqnn")
    module_name, class_name = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise   # a dependency of the backend is missing: let its own error show
        raise BackendError(f"backend {name!r} is not available in this hexbundle installation "
                           f"({module_name} is missing); use the reference backend") from None
    return getattr(module, class_name)()
