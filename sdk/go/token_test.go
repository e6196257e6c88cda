package asyncd

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestTokenFileIsReReadAsItRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	src := &tokenSource{path: path}
	t0 := time.Unix(1_800_000_000, 0)
	if got := src.get(t0); got != "" {
		t.Fatalf("no file: got %q, want no token", got)
	}
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := src.get(t0.Add(TokenFileRefresh)); got != "first" {
		t.Fatalf("got %q, want the file's token", got)
	}
	if err := os.WriteFile(path, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := src.get(t0.Add(TokenFileRefresh + time.Second)); got != "first" {
		t.Fatalf("within the refresh period: got %q, want the cached token", got)
	}
	if got := src.get(t0.Add(2 * TokenFileRefresh)); got != "second" {
		t.Fatalf("after the refresh period: got %q, want the rotated token", got)
	}
}
