package asyncd

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ValidateCron checks a cron schedule as an AsyncJobConfig's spec.cron[].schedule
// takes it: "CRON_TZ=<IANA zone> <schedule>", e.g. "CRON_TZ=Asia/Singapore 0 0 * * *".
// The zone is mandatory because a schedule without one fires at a different instant on
// every machine whose local zone differs. The schedule is five fields (minute hour
// day-of-month month day-of-week), six with a leading seconds field, or one of
// @yearly @annually @monthly @weekly @daily @midnight @hourly.
func ValidateCron(expr string) error {
	rest, ok := strings.CutPrefix(strings.TrimSpace(expr), "CRON_TZ=")
	if !ok {
		return fmt.Errorf("asyncd: cron %q: must start with CRON_TZ=<Area/City>, e.g. \"CRON_TZ=Europe/Berlin 0 3 * * *\"", expr)
	}
	zone, sched, _ := strings.Cut(rest, " ")
	if err := checkZone(zone); err != nil {
		return fmt.Errorf("asyncd: cron %q: %w", expr, err)
	}
	if err := checkSchedule(strings.TrimSpace(sched)); err != nil {
		return fmt.Errorf("asyncd: cron %q: %w", expr, err)
	}
	return nil
}

func checkZone(zone string) error {
	if zone == "" || zone == "Local" {
		return fmt.Errorf("CRON_TZ needs an IANA time zone name such as Europe/Berlin, got %q", zone)
	}
	if _, err := time.LoadLocation(zone); err != nil {
		return fmt.Errorf("unknown time zone %q", zone)
	}
	return nil
}

var cronMacros = map[string]bool{
	"@yearly": true, "@annually": true, "@monthly": true, "@weekly": true,
	"@daily": true, "@midnight": true, "@hourly": true,
}

type cronField struct {
	name     string
	lo, hi   int
	names    []string // names[i] stands for lo+i
	dom, dow bool     // where ?, L, W, # are allowed
}

var (
	months     = []string{"JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}
	weekdays   = []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}
	cronFields = []cronField{
		{name: "minute", lo: 0, hi: 59},
		{name: "hour", lo: 0, hi: 23},
		{name: "day-of-month", lo: 1, hi: 31, dom: true},
		{name: "month", lo: 1, hi: 12, names: months},
		{name: "day-of-week", lo: 0, hi: 7, names: weekdays, dow: true},
	}
	secondField = cronField{name: "second", lo: 0, hi: 59}
)

func checkSchedule(s string) error {
	if s == "" {
		return fmt.Errorf("no schedule after the time zone")
	}
	if strings.HasPrefix(s, "@") {
		if !cronMacros[strings.ToLower(s)] {
			return fmt.Errorf("unknown macro %q", s)
		}
		return nil
	}
	parts := strings.Fields(s)
	fields := cronFields
	switch len(parts) {
	case 5:
	case 6:
		fields = append([]cronField{secondField}, cronFields...)
	default:
		return fmt.Errorf("want 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds, got %d", len(parts))
	}
	for i, p := range parts {
		if err := fields[i].check(p); err != nil {
			return err
		}
	}
	return nil
}

func (f cronField) check(s string) error {
	for _, item := range strings.Split(s, ",") {
		if err := f.checkItem(item); err != nil {
			return fmt.Errorf("%s field %q: %w", f.name, s, err)
		}
	}
	return nil
}

func (f cronField) checkItem(item string) error {
	u := strings.ToUpper(item)
	switch {
	case u == "":
		return fmt.Errorf("empty list item")
	case u == "?" && (f.dom || f.dow):
		return nil
	case u == "L" && f.dom:
		return nil
	case f.dom && strings.HasSuffix(u, "W"):
		_, err := f.value(strings.TrimSuffix(u, "W"))
		return err
	case f.dow && strings.HasSuffix(u, "L"):
		_, err := f.value(strings.TrimSuffix(u, "L"))
		return err
	case f.dow && strings.Contains(u, "#"):
		d, nth, _ := strings.Cut(u, "#")
		if _, err := f.value(d); err != nil {
			return err
		}
		if n, err := strconv.Atoi(nth); err != nil || n < 1 || n > 5 {
			return fmt.Errorf("%q: nth weekday must be 1..5", item)
		}
		return nil
	}
	rng, step, hasStep := strings.Cut(u, "/")
	if hasStep {
		n, err := strconv.Atoi(step)
		if err != nil || n < 1 || n > f.hi-f.lo+1 {
			return fmt.Errorf("%q: step must be 1..%d", item, f.hi-f.lo+1)
		}
	}
	if rng == "*" {
		return nil
	}
	a, b, isRange := strings.Cut(rng, "-")
	lo, err := f.value(a)
	if err != nil {
		return err
	}
	if isRange {
		hi, err := f.value(b)
		if err != nil {
			return err
		}
		if lo > hi {
			return fmt.Errorf("%q: range runs backwards", item)
		}
	}
	return nil
}

func (f cronField) value(s string) (int, error) {
	for i, n := range f.names {
		if s == n {
			return f.lo + i, nil
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < f.lo || n > f.hi {
		return 0, fmt.Errorf("%q is not in %d..%d", s, f.lo, f.hi)
	}
	return n, nil
}
