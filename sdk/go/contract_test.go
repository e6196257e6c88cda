package asyncd

// The wire shapes of the asyncd-contract crate (contract/fixtures, generated from
// the Rust types the server uses): this SDK's own types must decode each fixture and
// encode it back to the same JSON, and its signing must reproduce the test vector.

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "contract", "fixtures", name+".json"))
	if err != nil {
		t.Fatalf("contract fixture: %v", err)
	}
	return b
}

// normalized decodes JSON into generic values, with every RFC 3339 string as Go
// writes times (the contract always writes milliseconds; Go drops zero ones).
func normalized(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	var walk func(any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				v[k] = walk(e)
			}
		case []any:
			for i, e := range v {
				v[i] = walk(e)
			}
		case string:
			if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
				return ts.UTC().Format(time.RFC3339Nano)
			}
		}
		return v
	}
	return walk(v)
}

// roundTrip decodes fixture name into v and encodes v again. With exact, the result
// must be the fixture; otherwise every member v writes must be the fixture's (for
// types that carry only part of a shape, such as TaskStatus).
func roundTrip(t *testing.T, name string, v any, exact bool) {
	t.Helper()
	want := fixture(t, name)
	if err := json.Unmarshal(want, v); err != nil {
		t.Fatalf("%s: decode into %T: %v", name, v, err)
	}
	got, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: encode %T: %v", name, v, err)
	}
	g, w := normalized(t, got), normalized(t, want)
	if exact {
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("%s: %T encodes as\n%s\nwant\n%s", name, v, got, want)
		}
		return
	}
	if !subset(g, w) {
		t.Fatalf("%s: %T encodes as\n%s\nnot a part of\n%s", name, v, got, want)
	}
}

// subset: every member of an object in got is in want with the same value.
func subset(got, want any) bool {
	switch g := got.(type) {
	case map[string]any:
		w, ok := want.(map[string]any)
		if !ok {
			return false
		}
		for k, gv := range g {
			if wv, ok := w[k]; !ok || !subset(gv, wv) {
				return false
			}
		}
		return true
	case []any:
		w, ok := want.([]any)
		if !ok || len(w) != len(g) {
			return false
		}
		for i := range g {
			if !subset(g[i], w[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(got, want)
}

func TestContractRequestsEncodeAsTheServerReadsThem(t *testing.T) {
	roundTrip(t, "submit_request", &submitBody{}, true)
	roundTrip(t, "batch_request", &struct {
		Tasks []*submitBody `json:"tasks"`
	}{}, true)
	roundTrip(t, "result_request", &resultBody{}, true)
	// The heartbeat and 202 bodies are maps in executor.go.
	roundTrip(t, "heartbeat_request", &map[string]any{}, true)
	roundTrip(t, "executor_accepted", &map[string]string{}, true)
	roundTrip(t, "dead_letter_bulk_request", &DeadLetterFilter{}, true)
}

func TestContractAnswersDecode(t *testing.T) {
	roundTrip(t, "submit_response", &SubmitResult{}, true)
	roundTrip(t, "redrive_response", &RedriveResult{}, true)
	roundTrip(t, "dead_letter_bulk_response", &BulkResult{}, true)
	roundTrip(t, "executor_call", &envelope{}, true)

	var st TaskStatus
	roundTrip(t, "task_status", &st, false)
	if st.IdempotencyKey != "order-42" || st.UniqueKey != "" || st.LastError != "executor answered 503: busy" ||
		st.State != StateSucceeded || !reflect.DeepEqual(normalized(t, st.Result), map[string]any{"rows": 12.0}) {
		t.Fatalf("task_status decodes as %+v", st)
	}
	var dead struct {
		Items []TaskStatus `json:"items"`
	}
	roundTrip(t, "dead_letters_response", &dead, false)
	if len(dead.Items) != 1 || dead.Items[0].State != StateDead || dead.Items[0].UniqueKey != "order:42" {
		t.Fatalf("dead_letters_response decodes as %+v", dead)
	}
}

func TestContractErrorsDecode(t *testing.T) {
	var cases []struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(fixture(t, "errors"), &cases); err != nil {
		t.Fatal(err)
	}
	codes := map[string]bool{}
	for _, c := range cases {
		var want struct {
			Error struct {
				Code, Message, Field, State string
				ExistingID                  string `json:"existing_id"`
			} `json:"error"`
		}
		if err := json.Unmarshal(c.Body, &want); err != nil {
			t.Fatal(err)
		}
		w := want.Error
		got := parseAPIError(c.Status, c.Body)
		exp := &APIError{Status: c.Status, Code: w.Code, Message: w.Message, Field: w.Field, ExistingID: w.ExistingID, State: w.State}
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("%s decodes as %+v, want %+v", c.Body, got, exp)
		}
		codes[got.Code] = true
	}
	if len(codes) != 18 {
		t.Errorf("the contract has %d codes, this SDK 18", len(codes))
	}
	for _, code := range []string{CodeMalformedJSON, CodeInvalidField, CodeUnknownTaskType, CodePayloadTooLarge,
		CodeUnauthenticated, CodeForbidden, CodeNotFound, CodeUniqueConflict, CodeIdempotencyMismatch, CodeNotCancellable, CodeStaleLease,
		CodeNotDead, CodeTaskCancelled, CodeStoreUnavailable, CodeKafkaUnavailable, CodeAuthUnavailable, CodeClockSkew, CodeSigningUnavailable} {
		if !codes[code] {
			t.Errorf("no contract fixture for %s", code)
		}
	}
}

// The signature vectors: the canonical string and signature of the contract's call,
// and every verification case, each on a fresh Verifier holding the case's keys.
func TestContractSignatureVectors(t *testing.T) {
	var v struct {
		Keys      map[string]string `json:"keys"`
		Tolerance int64             `json:"tolerance_seconds"`
		Canonical string            `json:"canonical"`
		Headers   map[string]string `json:"headers"`
		Body      string            `json:"body"`
		Cases     []struct {
			Name  string   `json:"name"`
			Keys  []string `json:"keys"`
			Steps []struct {
				Headers map[string]string `json:"headers"`
				Body    string            `json:"body"`
				Now     int64             `json:"now"`
				Want    string            `json:"want"`
			} `json:"steps"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(fixture(t, "signature"), &v); err != nil {
		t.Fatal(err)
	}
	if time.Duration(v.Tolerance)*time.Second != SignatureTolerance {
		t.Fatalf("tolerance %ds, the contract's %ds", int64(SignatureTolerance/time.Second), v.Tolerance)
	}
	header := func(m map[string]string) http.Header {
		h := http.Header{}
		for k, val := range m {
			h.Set(k, val)
		}
		return h
	}
	h := header(v.Headers)
	if got := string(CanonicalString(h, []byte(v.Body))); got != v.Canonical {
		t.Fatalf("CanonicalString = %q, the contract %q", got, v.Canonical)
	}
	if got := Sign([][]byte{[]byte(v.Keys["primary"])}, h, []byte(v.Body)); got != v.Headers[HeaderSignature] {
		t.Fatalf("Sign = %s, the contract %s", got, v.Headers[HeaderSignature])
	}
	outcome := func(err error) string {
		switch {
		case err == nil:
			return "ok"
		case errors.Is(err, ErrReplayed):
			return "replay"
		case errors.Is(err, ErrStaleTimestamp):
			return "stale"
		case errors.Is(err, ErrMalformedTimestamp):
			return "malformed_timestamp"
		case errors.Is(err, ErrBadSignature):
			return "mismatch"
		}
		return err.Error()
	}
	if len(v.Cases) < 20 {
		t.Fatalf("only %d cases", len(v.Cases))
	}
	for _, c := range v.Cases {
		var keys [][]byte
		for _, name := range c.Keys {
			keys = append(keys, []byte(v.Keys[name]))
		}
		verifier := NewVerifier(keys...)
		for i, step := range c.Steps {
			got := outcome(verifier.Verify(header(step.Headers), []byte(step.Body), time.Unix(step.Now, 0)))
			if got != step.Want {
				t.Errorf("%s, step %d: %s, want %s", c.Name, i+1, got, step.Want)
			}
		}
	}
}

// The cache is bounded: past MaxReplayEntries the oldest entries are forgotten, and
// entries whose window has passed are dropped as new calls come.
func TestVerifierReplayCacheIsBounded(t *testing.T) {
	key := []byte("k")
	verifier := NewVerifier(key)
	verifier.max = 3
	now := time.Unix(1_700_000_000, 0)
	call := func(id string, at time.Time) error {
		h := http.Header{}
		h.Set(HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
		h.Set(HeaderTaskID, id)
		h.Set(HeaderAttempt, "1")
		h.Set(HeaderSignature, Sign([][]byte{key}, h, nil))
		return verifier.Verify(h, nil, at)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := call(id, now); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if len(verifier.seen) != 3 || len(verifier.order) != 3 {
		t.Fatalf("%d entries, %d in order", len(verifier.seen), len(verifier.order))
	}
	if err := call("d", now); !errors.Is(err, ErrReplayed) {
		t.Fatalf("d again: %v", err)
	}
	if err := call("a", now); err != nil {
		t.Fatalf("the evicted a: %v", err)
	}
	later := now.Add(SignatureTolerance + time.Second)
	if err := call("e", later); err != nil {
		t.Fatal(err)
	}
	if len(verifier.seen) != 1 {
		t.Fatalf("expired entries kept: %v", verifier.seen)
	}
}
