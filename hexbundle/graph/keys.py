"""doit up-to-date keys: a task reruns when its step key (the options, toolchain, code and pins
it uses: graph.stepdesc declares them, formats.stepkey writes the key) changes.

Keys are computed when doit checks a task, not when dodo.py is loaded: `doit list` asks nothing
of the Docker engine, and a build asks it once.
"""
from __future__ import annotations

import functools
from pathlib import Path

from hexbundle.backends import describe
from hexbundle.config.build import BuildConfig
from hexbundle.config.toolchain import load_toolchain
from hexbundle.formats import stepkey
from hexbundle.graph.codekey import PACKAGE, code_digest, code_files
from hexbundle.support import hashing
from hexbundle.support.errors import HexbundleError
from hexbundle.toolchain import image

# The hexbundle code each step runs, from its entry modules' imports (graph.codekey; hashed,
# not imported: importing onnx costs ~1 s, which a no-op `doit bundle` must not pay). The
# entries are those dodo.py's actions reach by name: the step module steps.runner.STEPS runs
# (steps/inputs.py covers generating, the synthetic generator and the local split), plus
# checks/sizes.py, whose action runs first in task_bundle. Third-party code is not in it (see
# graph.codekey: toolchain_key below stands for it in the convert, compile and bundle keys).
STEP_CODE = {
    "inputs": ("hexbundle.steps.inputs",),
    "convert": ("hexbundle.steps.convert",),
    "compile": ("hexbundle.steps.compile",),
    "bundle": ("hexbundle.steps.bundle", "hexbundle.checks.sizes"),
    "verify": ("hexbundle.checks.verify",),
}


def step_code(step: str):
    """The digest of the code `step` runs, computed when doit checks the task (once per
    process): a changed line of that code reruns the step."""
    entries = STEP_CODE[step]

    def code() -> str:
        return code_digest(*entries)
    return code


def step_code_files(step: str) -> dict:
    """{file relative to the package's parent: XXH3} of the code `step` runs: kept beside the
    step's key so `--explain` can name the file that changed (graph.explain)."""
    files = code_files(STEP_CODE[step])
    return {p.relative_to(PACKAGE.parent).as_posix(): hashing.digest(p) for p in files.values()}


KEY_VALUE = "_step_key"          # the DB value: the key's canonical text (formats.stepkey)
CODE_VALUE = "_step_code_files"  # the DB value: step_code_files, for --explain


class step_key:
    """uptodate item: the task reruns when its step key's text changes. The key is canonical
    JSON (formats.stepkey, docs/step-key.md) of a document whose values may be callables (the
    toolchain, the code digest): they are called only when doit checks the task, once."""

    def __init__(self, code_of: str, document: dict):
        self.step = code_of
        self.document = document
        self._resolved = None

    def resolved(self) -> dict:
        """The document, callables called: what the task's outputs depend on besides its files
        (also its remote-cache Action's options: hexbundle.graph.remote_steps)."""
        if self._resolved is None:
            self._resolved = {k: (v() if callable(v) else v) for k, v in self.document.items()}
        return self._resolved

    def text(self) -> str:
        return stepkey.canonical(self.resolved())

    def configure_task(self, task) -> None:
        task.value_savers.append(lambda: {KEY_VALUE: self.text(),
                                          CODE_VALUE: step_code_files(self.step)})

    def __call__(self, task, values) -> bool:
        return values.get(KEY_VALUE) == self.text()

    def __repr__(self) -> str:
        return f"step_key({self.step!r})"


@functools.lru_cache(maxsize=None)
def _toolchain_key(backend: str, executor: str, root: Path) -> str:
    version, _ = describe(backend)
    if executor != "docker":
        return version
    return f"{version} in image {image_id(root) or '(unavailable)'}"


@functools.lru_cache(maxsize=None)
def image_id(root: Path) -> str:
    """The toolchain image's ID, as pinned for the steps (toolchain.docker.pinned_image: the one
    `doit image` recorded; "" when the engine or that image is not there, or its tag was moved:
    the step itself then fails, saying why). Asked of the engine once per run."""
    try:
        from hexbundle.toolchain.docker import docker_client, pinned_image
        return pinned_image(docker_client(), load_toolchain(root), root).id
    except HexbundleError:
        return ""


def toolchain_key(cfg: BuildConfig) -> str:
    """The toolchain as the steps' up-to-date keys name it: the backend's version, plus the image
    ID when the steps run in the container (so a rebuilt image reruns them, and switching
    executor does too). Asked of the engine once per run."""
    return _toolchain_key(cfg.backend, cfg.executor, cfg.root)


def pinned(cfg: BuildConfig, paths: list) -> dict:
    """The pins (from the model config's [inputs.pins]) that apply to these files."""
    pins = cfg.inputs.pins
    return {p.name: pins[p.name] for p in paths if p.name in pins}


def image_unchanged(root: Path):
    """uptodate item of `doit image`: the recorded image is still in the engine, built from the
    base asked for now (its --base option)."""
    def check(task, values) -> bool:
        return image.is_current(root, (task.options or {}).get("base", ""))
    return check
