"""Stand-in for qairt.api.compiler.config (tests only)."""
from qairt._standin import Config


class CompileConfig(Config):
    FIELDS = {"backend": None, "graph_custom_configs": None, "context_custom_configs": None,
              "device_custom_configs": None, "memory_custom_config": None, "log_level": None,
              "soc_details": None, "io_tensor_mem_type": None}
