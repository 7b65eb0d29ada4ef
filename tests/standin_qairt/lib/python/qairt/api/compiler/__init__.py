from qairt.api.compiler.config import CompileConfig  # noqa: F401
