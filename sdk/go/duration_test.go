package asyncd

import (
	"testing"
	"time"
)

// parseDuration reads every form the API's humantime parser takes (the API writes a
// schedule's durations back as they were given) and what formatDuration writes.
func TestParseDurationReadsHumantime(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90s":             90 * time.Second,
		"1m 30s":          90 * time.Second,
		"1h30m":           90 * time.Minute,
		" 2 hours  5min ": 2*time.Hour + 5*time.Minute,
		"1.5h":            90 * time.Minute,
		"0.25s":           250 * time.Millisecond,
		"1.000000001s":    time.Second + 1,
		"7d":              7 * 24 * time.Hour,
		"1w":              7 * 24 * time.Hour,
		"1M":              2_630_016 * time.Second,
		"1y":              31_557_600 * time.Second,
		"0s":              0,
		"250ms 5us 3ns":   250*time.Millisecond + 5*time.Microsecond + 3,
		"2µs":             2 * time.Microsecond,
		"1 0s":            10 * time.Second, // humantime skips spaces in a number
	} {
		got, err := parseDuration(in)
		if err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "s", "5", "1.s", "1x", "-1s", "1h-", "1e3s", "1.2.3s", "1h,2m", "300y", "99999999999999999999s"} {
		if got, err := parseDuration(bad); err == nil {
			t.Errorf("parseDuration(%q) = %v, want an error", bad, got)
		}
	}
	for _, d := range []time.Duration{0, 1, time.Second, 90 * time.Second, 36*time.Hour + 250*time.Millisecond + 7} {
		if got, err := parseDuration(formatDuration(d)); err != nil || got != d {
			t.Errorf("parseDuration(formatDuration(%v)) = %v, %v", d, got, err)
		}
	}
}
