"""Errors a user sees. Each message names the file, the key or tensor, and what to do."""
import os


class HexbundleError(Exception):
    """Base class: the message is user-facing; the CLI prints it without a traceback."""


class ConfigError(HexbundleError):
    """A TOML config is missing, malformed, has an unknown key, a wrong type or a bad value."""


class UnknownNameError(ConfigError):
    """A model or device name that no config defines. `key` is the setting that names it
    ("model", "device"), so the caller can say where the name was given."""

    def __init__(self, message: str, *, key: str = "", name: str = ""):
        super().__init__(message)
        self.key, self.name = key, name


class InputError(HexbundleError):
    """A model input (ONNX, external data, tokenizer) is missing or unusable."""


class EncodingsError(HexbundleError):
    """An AIMET encodings file is malformed or disagrees with its graph."""


class FormatError(HexbundleError):
    """A DLC or context binary is truncated, corrupt or of an unknown version."""


class BackendError(HexbundleError):
    """A backend refused or failed to convert or compile."""


class SharedWeightError(BackendError):
    """With weight sharing on, a tensor differs between the graphs that share it. `graphs` are
    the two graphs' names, so the caller can name the files those graphs came from."""

    def __init__(self, message: str, *, tensor: str = "", graphs: tuple = ()):
        super().__init__(message)
        self.tensor, self.graphs = tensor, tuple(graphs)


class SizeError(HexbundleError):
    """Built sizes disagree with the expected sizes (e.g. 4-bit weights not packed)."""


class OutputError(HexbundleError):
    """An output could not be written (disk full, file size limit, permissions): nothing partial
    is left behind, and the previous output stays in place."""


def output_error(path, exc: OSError) -> HexbundleError:
    """The user-facing form of a failed write: which file, why, what to do. An error of another
    file than the output (its temp file or a directory above it) is a read of an input while
    the output was written (an export's .data streamed into a DLC): named as that."""
    why = exc.strerror or str(exc)
    other = getattr(exc, "filename", None)
    if other is not None and not _is_output(os.fspath(other), os.fspath(path)):
        return InputError(f"{other}: cannot read it ({why}) while writing {path}; make it "
                          "readable (its permissions, the disk it is on), then run the build "
                          "again: nothing partial was kept")
    return OutputError(f"{path}: cannot write it ({why}); free disk space or raise the file-size "
                       "limit (ulimit -f), then run the build again: nothing partial was kept")


class VerifyError(HexbundleError):
    """A bundle does not compute what its ONNX computes, or cannot be run on the host to check."""


class DiskSpaceError(HexbundleError):
    """Not enough free disk space for what is about to be written (checked before writing)."""


class StepFailed(HexbundleError):
    """A build step exited non-zero: the message names the step and shows its log's last lines.
    `error` is the step's own error message (its log's last "error: " line), or "" when the
    step logged none (a crash, a kill)."""

    def __init__(self, message: str, *, error: str = ""):
        super().__init__(message)
        self.error = error


class ToolchainError(HexbundleError):
    """The toolchain is not the pinned one or cannot be reached: SDK archive or version, the
    container image, the docker engine, the Python lock or wheelhouse."""


class ContainerError(HexbundleError):
    """A step container could not be set up as configured ([container] in configs/build.toml),
    or one an interrupted run left could not be removed."""


def _is_output(failed: str, output: str) -> bool:
    """Whether the file an OSError names is the output written, its temp file (atomic's
    ".<name>.<pid>.<token>" beside it) or a directory above it."""
    failed, output = os.path.abspath(failed), os.path.abspath(output)
    if failed == output or output.startswith(failed.rstrip(os.sep) + os.sep):
        return True
    return (os.path.dirname(failed) == os.path.dirname(output)
            and os.path.basename(failed).startswith(f".{os.path.basename(output)}."))
