"""Stand-in for qairt.api.common.backends.htp.config (tests only); fields and defaults as in
qairt-dev 0.6.0 (tests/test_qairt_contract.py compares them with the real classes)."""
from qairt._standin import Config, REQUIRED
from qairt.api.configs.common import PerfProfile  # noqa: F401  (re-exported, as in the SDK)


class HtpGraphConfig(Config):
    FIELDS = {"name": REQUIRED, "vtcm_size_in_mb": 0, "vtcm_size": 0, "fp16_relaxed_precision": 0,
              "hvx_threads": 0, "optimization_type": 2, "finalize_config": None, "dlbc": 0,
              "dlbc_weights": 0, "weights_packing": False, "num_cores": None,
              "short_depth_conv_on_hmx_off": False, "fold_relu_activation_into_conv_off": False,
              "advanced_activation_fusion": True, "use_high_precision_fp16_sigmoid": False,
              "monolithic_lstm": False}

    def check(self):
        if self.optimization_type not in (1, 2, 3):
            raise ValueError(f"optimization_type must be between 1 and 3, got "
                             f"{self.optimization_type}")


class HtpDeviceCoreConfig(Config):
    FIELDS = {"id": 0, "perf_profile": PerfProfile.BURST, "rpc_control_latency": 100,
              "rpc_polling_time": 9999, "hmx_timeout_us": 300000, "adaptive_polling_time": 0}

    def check(self):
        PerfProfile(self.perf_profile)      # by value ("burst"), as pydantic does


class HtpDeviceConfig(Config):
    FIELDS = {"id": 0, "soc_id": 0, "soc_model": 0, "dsp_arch": None, "pd_session": "unsigned",
              "profiling_level": "linting", "core_ids": None, "core_type": 0, "cores": []}


class HtpContextConfig(Config):
    FIELDS = {"weight_sharing_enabled": False, "file_read_memory_budget_in_mb": 0,
              "io_memory_estimation": False, "max_spill_fill_buffer_for_group": 0,
              "group_id": 0, "extended_udma": False, "init_acceleration": False,
              "lora_weight_sharing": False, "lora_weight_sharing_ram_preload": False}
