"""The model config's [inputs.pins] checked against the files: a pinned input whose bytes
changed is refused. Paths and values only (the convert step calls it with its description's
files and options, the inputs and bundle steps likewise)."""
from __future__ import annotations

from hexbundle.support import hashing
from hexbundle.support.errors import InputError
from hexbundle.support.files import require_regular_file


def require_pins(paths: list, pins: dict, config) -> None:
    """A pinned input whose bytes changed is refused, naming the file and both digests.
    `pins`: file name -> "sha256:..." | "xxh3:..."; `config`: the model config that pins them
    (named in the message)."""
    for path in paths:
        pin = pins.get(path.name)
        if pin is None:
            continue
        algorithm, want = pin.split(":", 1)
        require_regular_file(path, "pinned input")   # hashing a FIFO would block forever
        got = hashing.sha256_file(path) if algorithm == "sha256" else hashing.digest(path)
        if got != want:
            raise InputError(f"{path}: {algorithm} is {got}, but {config} pins "
                             f"[inputs.pins] {path.name!r} = \"{pin}\"; re-export the model or "
                             "update the pin if this change is intended")
