"""The real qairt-dev classes for the contract tests (marker real_qairt), loaded from the pinned
wheel (requirements/contract.lock, fetched by `doit contract_wheel` into
build/wheelhouse/contract) without running its qairt/__init__.py, which calls Qualcomm's release
API over HTTPS at import time. Only the SDK-internal qti.* modules are stubbed: every name they
export is a plain class (or, for the logging utilities, a MagicMock); the one base class that
matters, qti's AISWBaseModel, is a pydantic BaseModel with extra="forbid" (what ConverterConfig's
copy-then-allow implies), validate_assignment and arbitrary types -- the stub's choice, since
qti is not public. HtpGraphConfig & co. set their own model_config and are fully real. The
Genie config schema (qairt/modules/genie_execution/genie_config.py, GenieConfig) is loaded the
same way, without its package's __init__ (which imports the native Genie library); its models
derive from that AISWBaseModel, so the stub's extra="forbid" applies to them: the tests also
compare what GenieConfig gives back with what went in, which holds whatever `extra` is."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
import zipfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "contract.lock"
WHEELS = ROOT / "build" / "wheelhouse" / "contract"
PACKAGES = ("qairt", "qairt.api", "qairt.api.compiler", "qairt.utils", "qairt.modules",
            "qairt.modules.genie_execution")   # __init__ not run
MOCKED = {"QAIRTLogger", "LogAreas", "DeviceFactory", "HtpBackend", "AicBackend",
          "HtpMcpBackend"}


class _QtiModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "AISWBaseModel":
            from pydantic import BaseModel, ConfigDict
            value = type("AISWBaseModel", (BaseModel,), {
                "__module__": self.__name__,
                "model_config": ConfigDict(extra="forbid", validate_assignment=True,
                                           arbitrary_types_allowed=True)})
        elif name in MOCKED or not name[:1].isupper():
            value = mock.MagicMock(name=f"{self.__name__}.{name}")
        else:
            value = type(name, (), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _QtiFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "qti" or fullname.startswith("qti."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _QtiModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def locked_wheel() -> tuple:
    """(wheel path or None, what the lock pins)."""
    from hexbundle.support.hashing import sha256_file
    from hexbundle.toolchain.wheelhouse import read_lock
    (entry,) = read_lock(LOCK)
    for wheel in sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []:
        if sha256_file(wheel) in entry.hashes:
            return wheel, f"{entry.name}=={entry.version}"
    return None, f"{entry.name}=={entry.version}"


def load(wheel: Path, dest: Path) -> types.SimpleNamespace:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("qairt", "qti")}
    for k in saved:
        del sys.modules[k]
    finder = _QtiFinder()
    sys.meta_path.insert(0, finder)
    for name in PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(dest.joinpath(*name.split(".")))]
        sys.modules[name] = module
    with warnings.catch_warnings():   # genie_config's pydantic-v1 @validator: Qualcomm's to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        mods = {n: importlib.import_module(n) for n in (
            "qairt.api.compiler.config", "qairt.api.common.backends.htp.config",
            "qairt.api.configs.common", "qairt.api.converter.converter_config",
            "qairt.api.compiler.config_util", "qairt.utils.loggers",
            "qairt.modules.genie_execution.genie_config")}
    return types.SimpleNamespace(
        modules=mods, finder=finder, saved=saved,
        CompileConfig=mods["qairt.api.compiler.config"].CompileConfig,
        htp=mods["qairt.api.common.backends.htp.config"],
        PerfProfile=mods["qairt.api.configs.common"].PerfProfile,
        ConverterConfig=mods["qairt.api.converter.converter_config"].ConverterConfig,
        options_dict=mods["qairt.api.compiler.config_util"].get_config_api_options_dict,
        loggers=mods["qairt.utils.loggers"],
        GenieConfig=mods["qairt.modules.genie_execution.genie_config"].GenieConfig)


def unload(api) -> None:
    for k in [k for k in sys.modules if k.split(".")[0] in ("qairt", "qti")]:
        del sys.modules[k]
    sys.modules.update(api.saved)
    sys.meta_path.remove(api.finder)
