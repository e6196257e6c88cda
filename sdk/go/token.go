package asyncd

import (
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultTokenFile is where a client looks for its bearer token when given no
// WithToken or WithTokenFile: mount a projected ServiceAccount token for the audience
// "asyncd" there (docs/security.md).
const DefaultTokenFile = "/var/run/secrets/asyncd/token"

// TokenFileRefresh is how long a token read from a file is used before the file is read
// again. The kubelet renews a projected token well before it expires (at 80% of its
// lifetime, at least 10 minutes), so a minute is always in time.
const TokenFileRefresh = time.Minute

type tokenSource struct {
	static string
	path   string

	mu     sync.Mutex
	cached string
	readAt time.Time
}

func (t *tokenSource) get(now time.Time) string {
	if t.path == "" {
		return t.static
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.readAt.IsZero() || now.Sub(t.readAt) >= TokenFileRefresh {
		raw, err := os.ReadFile(t.path)
		if err != nil {
			// No file (asyncd dev, no auth): send nothing; the server says 401 if it needs one.
			t.cached = ""
		} else {
			t.cached = strings.TrimSpace(string(raw))
		}
		t.readAt = now
	}
	return t.cached
}
