package asyncd

import (
	"strconv"
	"strings"
	"time"
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

// formatTime renders t as the API writes times: RFC 3339, UTC, milliseconds.
func formatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
