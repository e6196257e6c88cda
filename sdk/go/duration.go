package asyncd

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// formatDuration renders d in the humantime form the API reads ("1h 30m 5s 250ms").
// time.Duration.String is not used: it writes fractions ("1.5s") that humantime refuses.
func formatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var b strings.Builder
	if d < 0 {
		// The API refuses negative durations; keep the sign so its error names the field.
		b.WriteByte('-')
		d = -d
	}
	units := []struct {
		size time.Duration
		name string
	}{
		{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"},
		{time.Millisecond, "ms"}, {time.Microsecond, "us"}, {time.Nanosecond, "ns"},
	}
	first := true
	for _, u := range units {
		if n := d / u.size; n > 0 {
			if !first {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.FormatInt(int64(n), 10))
			b.WriteString(u.name)
			d -= n * u.size
			first = false
		}
	}
	return b.String()
}

// humantimeUnits are the units the API's duration parser (Rust's humantime) reads; a
// month is 30.44 days and a year 365.25 days, as there.
var humantimeUnits = map[string]time.Duration{
	"nanos": 1, "nsec": 1, "ns": 1,
	"usec": time.Microsecond, "us": time.Microsecond, "µs": time.Microsecond,
	"millis": time.Millisecond, "msec": time.Millisecond, "ms": time.Millisecond,
	"seconds": time.Second, "second": time.Second, "secs": time.Second, "sec": time.Second, "s": time.Second,
	"minutes": time.Minute, "minute": time.Minute, "min": time.Minute, "mins": time.Minute, "m": time.Minute,
	"hours": time.Hour, "hour": time.Hour, "hr": time.Hour, "hrs": time.Hour, "h": time.Hour,
	"days": day, "day": day, "d": day,
	"weeks": 7 * day, "week": 7 * day, "wk": 7 * day, "wks": 7 * day, "w": 7 * day,
	"months": 2_630_016 * time.Second, "month": 2_630_016 * time.Second, "M": 2_630_016 * time.Second,
	"years": 31_557_600 * time.Second, "year": 31_557_600 * time.Second, "yr": 31_557_600 * time.Second,
	"yrs": 31_557_600 * time.Second, "y": 31_557_600 * time.Second,
}

const day = 24 * time.Hour

// parseDuration reads a duration as the API writes it back, which is as it was given:
// any of humantime's forms, spans of a number (a fraction allowed) and a unit, with or
// without spaces between them ("90s", "1h 30m", "1h30m", "1.5h", "2 days").
func parseDuration(s string) (time.Duration, error) {
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("duration %q: %s", s, why)
	}
	rest := strings.TrimSpace(s)
	if rest == "" {
		return bad("empty")
	}
	isDigit := func(r rune) bool { return r >= '0' && r <= '9' }
	var total time.Duration
	for rest != "" {
		// The number: digits, then maybe a fraction; humantime skips whitespace in it.
		i := strings.IndexFunc(rest, func(r rune) bool { return !isDigit(r) && r != '.' && !unicode.IsSpace(r) })
		if i < 0 {
			return bad("a number without a unit")
		}
		number := strings.Join(strings.Fields(rest[:i]), "")
		rest = rest[i:]
		whole, frac, hasFrac := strings.Cut(number, ".")
		if whole == "" || strings.IndexFunc(whole, func(r rune) bool { return !isDigit(r) }) >= 0 {
			return bad("expected a number")
		}
		if hasFrac && (frac == "" || strings.IndexFunc(frac, func(r rune) bool { return !isDigit(r) }) >= 0) {
			return bad("expected digits and a unit after the decimal point")
		}
		n, err := strconv.ParseInt(whole, 10, 64)
		if err != nil {
			return bad("number too large")
		}
		rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
		j := strings.IndexFunc(rest, func(r rune) bool { return !unicode.IsLetter(r) })
		if j < 0 {
			j = len(rest)
		}
		unit, ok := humantimeUnits[rest[:j]]
		if !ok {
			return bad(fmt.Sprintf("unknown unit %q", rest[:j]))
		}
		rest = strings.TrimLeftFunc(rest[j:], unicode.IsSpace)
		if n > int64(math.MaxInt64/unit) {
			return bad("too long for a time.Duration")
		}
		span := time.Duration(n) * unit
		if frac != "" {
			// The fraction of the unit, to the nanosecond (at most 18 digits count).
			if len(frac) > 18 {
				frac = frac[:18]
			}
			num, _ := strconv.ParseInt(frac, 10, 64)
			den := int64(math.Pow10(len(frac)))
			hi, lo := bits.Mul64(uint64(num), uint64(unit))
			q, _ := bits.Div64(hi, lo, uint64(den))
			span += time.Duration(q)
		}
		if span < 0 || total > math.MaxInt64-span {
			return bad("too long for a time.Duration")
		}
		total += span
	}
	return total, nil
}

// formatTime renders t as the API writes times: RFC 3339, UTC, milliseconds.
func formatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
