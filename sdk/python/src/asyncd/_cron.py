"""Client-side check of cron schedules for AsyncJobConfig documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

from ._errors import AsyncdError


class InvalidCron(AsyncdError, ValueError):
    """A cron schedule asyncd would refuse."""


_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: Tuple[str, ...] = ()
    dom: bool = False
    dow: bool = False

    def value(self, s: str) -> int:
        if s in self.names:
            return self.lo + self.names.index(s)
        if s.isdigit() and self.lo <= int(s) <= self.hi:
            return int(s)
        raise InvalidCron(f"{s!r} is not in {self.lo}..{self.hi}")

    def check(self, s: str) -> None:
        for item in s.split(","):
            try:
                self._check_item(item)
            except InvalidCron as e:
                raise InvalidCron(f"{self.name} field {s!r}: {e}") from None

    def _check_item(self, item: str) -> None:
        u = item.upper()
        if u == "":
            raise InvalidCron("empty list item")
        if u == "?" and (self.dom or self.dow):
            return
        if u == "L" and self.dom:
            return
        if self.dom and u.endswith("W"):
            self.value(u[:-1])
            return
        if self.dow and u.endswith("L"):
            self.value(u[:-1])
            return
        if self.dow and "#" in u:
            d, _, nth = u.partition("#")
            self.value(d)
            if not (nth.isdigit() and 1 <= int(nth) <= 5):
                raise InvalidCron(f"{item!r}: nth weekday must be 1..5")
            return
        rng, has_step, step = u.partition("/")
        if has_step:
            span = self.hi - self.lo + 1
            if not (step.isdigit() and 1 <= int(step) <= span):
                raise InvalidCron(f"{item!r}: step must be 1..{span}")
        if rng == "*":
            return
        a, is_range, b = rng.partition("-")
        lo = self.value(a)
        if is_range and lo > self.value(b):
            raise InvalidCron(f"{item!r}: range runs backwards")


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31, dom=True),
    _Field("month", 1, 12, names=_MONTHS),
    _Field("day-of-week", 0, 7, names=_WEEKDAYS, dow=True),
)
_SECOND = _Field("second", 0, 59)


def validate_cron(expr: str) -> None:
    """Checks a schedule as an AsyncJobConfig's ``spec.cron[].schedule`` takes it:
    ``"CRON_TZ=<IANA zone> <schedule>"``, e.g. ``"CRON_TZ=Asia/Singapore 0 0 * * *"``.
    The zone is mandatory: without one a schedule fires at a different instant on every
    machine whose local zone differs. The schedule is five fields, six with a leading
    seconds field, or an @daily-style macro. Raises :class:`InvalidCron`."""
    s = expr.strip()
    if not s.startswith("CRON_TZ="):
        raise InvalidCron(
            f'cron {expr!r}: must start with CRON_TZ=<Area/City>, e.g. "CRON_TZ=Europe/Berlin 0 3 * * *"'
        )
    zone, _, sched = s[len("CRON_TZ="):].partition(" ")
    try:
        _check_zone(zone)
        _check_schedule(sched.strip())
    except InvalidCron as e:
        raise InvalidCron(f"cron {expr!r}: {e}") from None


def _check_zone(zone: str) -> None:
    if zone in ("", "Local"):
        raise InvalidCron(f"CRON_TZ needs an IANA time zone name such as Europe/Berlin, got {zone!r}")
    if not _zone_exists(zone):
        raise InvalidCron(f"unknown time zone {zone!r}")


def _zone_exists(zone: str) -> bool:
    try:
        import zoneinfo  # Python 3.9+
    except ImportError:  # pragma: no cover
        return True
    try:
        zoneinfo.ZoneInfo(zone)
        return True
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False


def _check_schedule(s: str) -> None:
    if not s:
        raise InvalidCron("no schedule after the time zone")
    if s.startswith("@"):
        if s.lower() not in _MACROS:
            raise InvalidCron(f"unknown macro {s!r}")
        return
    parts = s.split()
    fields: Sequence[_Field]
    if len(parts) == 5:
        fields = _FIELDS
    elif len(parts) == 6:
        fields = (_SECOND,) + _FIELDS
    else:
        raise InvalidCron(
            f"want 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds, got {len(parts)}"
        )
    for f, p in zip(fields, parts):
        f.check(p)


def is_valid_cron(expr: str) -> bool:
    try:
        validate_cron(expr)
    except InvalidCron:
        return False
    return True


__all__ = ["InvalidCron", "validate_cron", "is_valid_cron"]
