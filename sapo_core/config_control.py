"""The power rules and the throttle (`[control]` in node.toml): when the node may run and how much of
the machine it may use, as BOINC's preferences do.

A table of its own so that `sapo_core.config` stays small; it nests `ControlConfig` in `NodeConfig`
and re-exports it. Standard library only (the schedule's parser is imported when it is checked).
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo_core.config_schema import ConfigError, check, setting


@dataclass(frozen=True)
class ControlConfig:
    throttle: float = setting("Share of the CPU time the node may use, 0.05..1 (a duty cycle, as in BOINC).", 1.0)
    pause_on_battery: bool = setting("Pause while running on battery.", False)
    only_when_idle: bool = setting("Run only while the user is idle.", False)
    idle_minutes: float = setting("Minutes without input before the user counts as idle.", 5.0)
    schedule: str = setting("Weekly schedule, e.g. 'mon-fri 18:00-08:00; sat-sun 00:00-24:00'; empty = always.", "")
    max_temperature_c: float = setting("Pause above this CPU temperature (0 = off); resumes 5 °C below it.", 0.0)
    min_free_memory_gb: float = setting("Pause when free memory falls below this (0 = off).", 0.0)
    idle_cpu_percent: float = setting(
        "Where the OS does not tell input idle time, 'only when idle' treats the user as busy while other "
        "programs use more than this % of the CPU.",
        25.0,
    )
    check_seconds: float = setting("How often the rules read the machine (battery, idle time, temperature...).", 2.0)
    max_cpus_percent: float = setting(
        "Use at most this % of the CPU cores (BOINC's 'use at most N % of the CPUs'); the node's "
        "threads stay within it, and fewer while other programs keep cores busy.",
        100.0,
    )
    leave_cores: int = setting(
        "Cores always left to your own programs (the desktop default leaves one, so the computer "
        "stays responsive; 0 on a machine that does nothing else). The node keeps at least one thread.",
        1,
    )

    def __post_init__(self) -> None:
        check(0.05 <= self.throttle <= 1.0, "control.throttle", "must be between 0.05 and 1")
        check(self.idle_minutes >= 0, "control.idle_minutes", "must be >= 0")
        check(self.max_temperature_c >= 0, "control.max_temperature_c", "must be >= 0")
        check(self.min_free_memory_gb >= 0, "control.min_free_memory_gb", "must be >= 0")
        check(0 <= self.idle_cpu_percent <= 100, "control.idle_cpu_percent", "must be between 0 and 100")
        check(0.05 <= self.check_seconds <= 600, "control.check_seconds", "must be between 0.05 and 600")
        check(1 <= self.max_cpus_percent <= 100, "control.max_cpus_percent", "must be between 1 and 100")
        check(self.leave_cores >= 0, "control.leave_cores", "must be >= 0")
        from sapo_core.control.schedule import ScheduleError, parse_schedule

        try:
            parse_schedule(self.schedule)
        except ScheduleError as e:
            raise ConfigError(f"control.schedule: {e}") from None
