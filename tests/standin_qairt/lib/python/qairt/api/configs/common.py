"""Stand-in for qairt.api.configs.common (tests only): PerfProfile lives here in the real SDK."""
import enum


class PerfProfile(str, enum.Enum):
    DEFAULT = "default"
    BALANCED = "balanced"
    HIGH_PERFORMANCE = "high_performance"
    SUSTAINED_HIGH_PERFORMANCE = "sustained_high_performance"
    BURST = "burst"
    POWER_SAVER = "power_saver"
