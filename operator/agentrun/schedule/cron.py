"""Cron times of a schedule, by ``cronsim`` (the cron expression parser and evaluator of
Healthchecks.io: pure Python, no dependencies, time zones through :mod:`zoneinfo` with cron's own
rules across DST changes). No parser here: this maps CronJob's descriptors (``@daily``) to the five
fields they mean and asks cronsim. Pure: no I/O but the zone database :mod:`zoneinfo` reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agentrun.api.schedule import MACROS


class InvalidCron(ValueError):
    """The schedule or the time zone cannot be used: ``field`` names which, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def zone(name: str | None) -> tzinfo:
    """The time zone ``name`` (None: UTC); :class:`InvalidCron` naming spec.timeZone otherwise."""
    if not name:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidCron("spec.timeZone", f"spec.timeZone: unknown time zone {name[:64]!r} (an IANA name, "
                          "e.g. \"Europe/Berlin\")") from None


@dataclass(frozen=True)
class Cron:
    """A checked schedule in its time zone."""

    expr: str
    tz: tzinfo

    @classmethod
    def parse(cls, schedule: str, time_zone: str | None) -> Cron:
        """The schedule of ``spec.schedule`` read in ``spec.timeZone``; :class:`InvalidCron` naming
        the field when cron refuses it."""
        tz = zone(time_zone)
        text = schedule.strip()
        expr = MACROS.get(text, text)
        shown = schedule[:128]
        if text.startswith("@") and text not in MACROS:
            raise InvalidCron("spec.schedule", f"spec.schedule: unknown descriptor {shown!r} (use one of "
                              + ", ".join(MACROS) + ")")
        if len(expr.split()) != 5:
            raise InvalidCron("spec.schedule", f"spec.schedule: {shown!r} has {len(expr.split())} fields; a cron "
                              "expression has five: minute hour day-of-month month day-of-week")
        try:
            CronSim(expr, datetime(2000, 1, 1, tzinfo=tz))
        except CronSimError as exc:
            raise InvalidCron("spec.schedule", f"spec.schedule: {shown!r} is not a cron expression: {exc}") from None
        return cls(expr, tz)

    def after(self, t: datetime) -> datetime:
        """The first scheduled time strictly after ``t`` (in UTC)."""
        return next(iter(CronSim(self.expr, t.astimezone(self.tz)))).astimezone(UTC)

    def latest(self, after: datetime, until: datetime) -> datetime | None:
        """The latest scheduled time ``t`` with ``after < t <= until`` (in UTC), or None."""
        if until <= after:
            return None
        # cronsim's reverse walk yields times strictly before its start; cron times are whole minutes
        start = until.replace(microsecond=0) + timedelta(seconds=1)
        t = next(iter(CronSim(self.expr, start.astimezone(self.tz), reverse=True))).astimezone(UTC)
        return t if after < t <= until else None

    def count(self, after: datetime, until: datetime, cap: int) -> int:
        """How many scheduled times ``t`` have ``after < t <= until``, counting at most ``cap``."""
        n = 0
        for t in CronSim(self.expr, after.astimezone(self.tz)):
            if t.astimezone(UTC) > until or n >= cap:
                break
            n += 1
        return n
