"""Errors a user sees. Each message names the file, the key or tensor, and what to do."""


class HexbundleError(Exception):
    """Base class: the message is user-facing; the CLI prints it without a traceback."""


class ConfigError(HexbundleError):
    """A TOML config is missing, malformed, has an unknown key, a wrong type or a bad value."""


class InputError(HexbundleError):
    """A model input (ONNX, external data, tokenizer) is missing or unusable."""


class EncodingsError(HexbundleError):
    """An AIMET encodings file is malformed or disagrees with its graph."""


class FormatError(HexbundleError):
    """A DLC or context binary is truncated, corrupt or of an unknown version."""


class BackendError(HexbundleError):
    """A backend refused or failed to convert or compile."""


class SizeError(HexbundleError):
    """Built sizes disagree with the expected sizes (e.g. 4-bit weights not packed)."""
