"""Stand-in for qairt.api.compiler.config (tests only)."""
from qairt._standin import Config, REQUIRED


class CompileConfig(Config):
    FIELDS = {"backend": REQUIRED, "graph_custom_configs": None, "context_custom_configs": None,
              "device_custom_configs": None, "memory_custom_config": None, "log_level": "error",
              "soc_details": None, "io_tensor_mem_type": "raw", "debug": False,
              "op_packages": None, "compiler_custom_configs": None,
              "enable_intermediate_outputs": None, "set_output_tensors": None,
              "data_format_config": None, "group_context_config": None,
              "backend_binary_path": None}

    def check(self):
        if self.backend not in ("HTP", "HTP_MCP", "AIC"):      # offline-preparable, by value
            raise ValueError(f"Invalid backend type: {self.backend}")
        ctx = (self.context_custom_configs or [None])[0]
        dev = (self.device_custom_configs or [None])[0]
        if ctx is not None and getattr(ctx, "extended_udma", False) and dev is not None \
                and dev.dsp_arch is not None and int(str(dev.dsp_arch).lstrip("v")) < 81:
            raise ValueError("extended_udma is only supported on HTP v81 and above, but "
                             f"dsp_arch '{dev.dsp_arch}' was found.")
