"""Stand-in for qairt.api.configs.common (tests only): PerfProfile lives here in the real SDK;
its 14 members as in qairt-dev 0.6.0."""
import enum


class PerfProfile(str, enum.Enum):
    LOW_BALANCED = "low_balanced"
    BALANCED = "balanced"
    DEFAULT = "default"
    HIGH_PERFORMANCE = "high_performance"
    SUSTAINED_HIGH_PERFORMANCE = "sustained_high_performance"
    BURST = "burst"
    EXTREME_POWER_SAVER = "extreme_power_saver"
    LOW_POWER_SAVER = "low_power_saver"
    POWER_SAVER = "power_saver"
    HIGH_POWER_SAVER = "high_power_saver"
    SYSTEM_SETTINGS = "system_settings"
    NO_USER_INPUT = "no_user_input"
    CUSTOM = "custom"
    INVALID = "invalid"
