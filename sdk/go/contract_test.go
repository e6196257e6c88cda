package asyncd

// The wire shapes of the asyncd-contract crate (contract/fixtures, generated from
// the Rust types the server uses): this SDK's own types must decode each fixture and
// encode it back to the same JSON, and its signing must reproduce the test vector.

import (
	"bytes"
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
	roundTrip(t, "schedule_create_request", &scheduleCreate{}, true)
	roundTrip(t, "backfill_request", &backfillBody{}, true)
}

// The bodies CreateSchedule, PutSchedule and BackfillSchedule build from the typed
// values of schedule_create_request.json and backfill_request.json are those fixtures.
func TestContractScheduleBodiesFromTypedValues(t *testing.T) {
	startAt := time.Date(2026, 11, 30, 8, 45, 0, 0, time.FixedZone("CET", 3600))
	spec := ScheduleSpec{
		Cron:     "CRON_TZ=Europe/Berlin 0 9 * * MON",
		Payload:  map[string]any{"customer": 42, "week_of": "{{scheduled_at}}"},
		Priority: 3, Overlap: OverlapBufferOne, CatchUp: CatchUpFor(time.Hour), Jitter: 5 * time.Minute,
		StartAt: &startAt,
	}
	got, err := json.Marshal(scheduleCreate{Job: "send-email", Name: "weekly-42", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	want := normalized(t, fixture(t, "schedule_create_request")).(map[string]any)
	if g := normalized(t, got); !reflect.DeepEqual(g, want) {
		t.Fatalf("the create body encodes as\n%s\nwant\n%v", got, want)
	}
	// PUT's body is the same spec without job and name.
	got, err = json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	delete(want, "job")
	delete(want, "name")
	if g := normalized(t, got); !reflect.DeepEqual(g, want) {
		t.Fatalf("the put body encodes as\n%s\nwant\n%v", got, want)
	}
	// Every, in the SDK's humantime units.
	every, err := json.Marshal(ScheduleSpec{Every: 90 * time.Second})
	if err != nil || string(every) != `{"every":"1m 30s","payload":null,"priority":0,"paused":false}` {
		t.Fatalf("an Every spec encodes as %s (%v)", every, err)
	}

	from := time.Date(2026, 11, 23, 7, 45, 0, 0, time.UTC)
	got, err = json.Marshal(backfillBody{From: formatTime(from), To: formatTime(from.Add(7 * 24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if g, w := normalized(t, got), normalized(t, fixture(t, "backfill_request")); !reflect.DeepEqual(g, w) {
		t.Fatalf("the backfill body encodes as\n%s\nwant\n%v", got, w)
	}
}

func TestContractAnswersDecode(t *testing.T) {
	var accepted SubmitResult
	roundTrip(t, "submit_response", &accepted, true)
	if accepted.Debounced || accepted.Dropped {
		t.Fatalf("submit_response decodes as %+v", accepted)
	}
	// A submit a trailing debounce folded into its key's waiting task: debounced, and
	// written back only when true (as the server does), so both fixtures round-trip.
	var debounced SubmitResult
	roundTrip(t, "submit_response_debounced", &debounced, true)
	if !debounced.Debounced || debounced.Dropped || debounced.Duplicate || debounced.ID != "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" ||
		!debounced.ETA.Equal(time.Date(2026, 11, 30, 8, 0, 0, 123e6, time.UTC)) {
		t.Fatalf("submit_response_debounced decodes as %+v", debounced)
	}
	roundTrip(t, "redrive_response", &RedriveResult{}, true)
	var pending PendingChange
	roundTrip(t, "change_pending_response", &pending, true)
	if pending != (PendingChange{ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Job: "send-email", Type: "email"}) {
		t.Fatalf("change_pending_response decodes as %+v", pending)
	}
	roundTrip(t, "dead_letter_bulk_response", &BulkResult{}, true)
	roundTrip(t, "executor_call", &envelope{}, true)

	var sched Schedule
	roundTrip(t, "schedule_response", &sched, true)
	checkContractSchedule(t, &sched)
	var page SchedulePage
	roundTrip(t, "schedules_response", &page, true)
	if len(page.Items) != 1 || page.NextCursor != "weekly-42" {
		t.Fatalf("schedules_response decodes as %+v", page)
	}
	checkContractSchedule(t, &page.Items[0])
	var backfill BackfillResult
	roundTrip(t, "backfill_response", &backfill, true)
	if backfill != (BackfillResult{Firings: 7, Created: 6}) {
		t.Fatalf("backfill_response decodes as %+v", backfill)
	}

	var st TaskStatus
	roundTrip(t, "task_status", &st, false)
	expiresAt := time.Date(2026, 11, 30, 8, 10, 0, 123e6, time.UTC)
	if st.IdempotencyKey != "order-42" || st.UniqueKey != "" || st.LastError != "executor answered 503: busy" ||
		st.State != StateSucceeded || !reflect.DeepEqual(normalized(t, st.Result), map[string]any{"rows": 12.0}) ||
		st.ExpiresAt == nil || !st.ExpiresAt.Equal(expiresAt) {
		t.Fatalf("task_status decodes as %+v", st)
	}
	var dead struct {
		Items []TaskStatus `json:"items"`
	}
	roundTrip(t, "dead_letters_response", &dead, false)
	if len(dead.Items) != 1 || dead.Items[0].State != StateDead || dead.Items[0].UniqueKey != "order:42" ||
		dead.Items[0].ExpiresAt == nil || !dead.Items[0].ExpiresAt.Equal(expiresAt) {
		t.Fatalf("dead_letters_response decodes as %+v", dead)
	}
	// A task that never expires has no expires_at: nil, and none written back.
	var never TaskStatus
	if err := json.Unmarshal([]byte(`{"id":"a","state":"pending","expires_at":null}`), &never); err != nil || never.ExpiresAt != nil {
		t.Fatalf("expires_at null decodes as %v (%v)", never.ExpiresAt, err)
	}
	if raw, _ := json.Marshal(never); bytes.Contains(raw, []byte("expires_at")) {
		t.Fatalf("a status without expiry encodes as %s", raw)
	}
}

// The body Client.body builds from a Task holding the values of submit_request.json is
// that fixture: every field the SDK sets lands under the server's name. (The SDK writes
// the delay in its own humantime units, "1m 30s", which the server reads as the
// fixture's "90s".)
func TestContractSubmitBodyFromTask(t *testing.T) {
	c := NewClient(WithServiceName("orders"))
	task := &Task{
		Type: "send_email", Payload: map[string]any{"to": "a@b.c"}, IdempotencyKey: "order-42",
		UniqueKey: "order:42", Priority: 5, MaxRetries: Retries(3), Timeout: 30 * time.Second,
		DependsOn: []string{"0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a50"}, Delay: 90 * time.Second,
		StartWithin: 10 * time.Minute,
	}
	b, err := c.body(task)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	want := normalized(t, fixture(t, "submit_request")).(map[string]any)
	if want["delay"] != "90s" {
		t.Fatalf("submit_request.json's delay is %v; update this test", want["delay"])
	}
	want["delay"] = "1m 30s"
	if g := normalized(t, got); !reflect.DeepEqual(g, want) {
		t.Fatalf("Task encodes as\n%s\nwant\n%v", got, want)
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
	if len(codes) != 22 {
		t.Errorf("the contract has %d codes, this SDK 22", len(codes))
	}
	for _, code := range []string{CodeMalformedJSON, CodeInvalidField, CodeUnknownTaskType, CodePayloadTooLarge,
		CodeUnauthenticated, CodeForbidden, CodeNotFound, CodeUniqueConflict, CodeIdempotencyMismatch, CodeNotCancellable, CodeStaleLease,
		CodeNotDead, CodeTaskStarted, CodeThrottled, CodeScheduleExists, CodeScheduleReadOnly, CodeTaskCancelled, CodeStoreUnavailable,
		CodeKafkaUnavailable, CodeAuthUnavailable, CodeClockSkew, CodeSigningUnavailable} {
		if !codes[code] {
			t.Errorf("no contract fixture for %s", code)
		}
	}
	// The schedule refusals are their own sentinels, 409s that are not retryable; a
	// create's names the field.
	for _, c := range cases {
		got := parseAPIError(c.Status, c.Body)
		switch got.Code {
		case CodeScheduleExists:
			if !errors.Is(got, ErrScheduleExists) || errors.Is(got, ErrScheduleReadOnly) || got.Status != http.StatusConflict ||
				got.Field != "name" || got.Retryable() {
				t.Errorf("the schedule_exists fixture decodes as %+v", got)
			}
		case CodeScheduleReadOnly:
			if !errors.Is(got, ErrScheduleReadOnly) || errors.Is(got, ErrScheduleExists) || got.Status != http.StatusConflict || got.Retryable() {
				t.Errorf("the schedule_read_only fixture decodes as %+v", got)
			}
		}
	}
	// The throttled refusal is ErrThrottled, naming the key's task and the field.
	for _, c := range cases {
		got := parseAPIError(c.Status, c.Body)
		if got.Code != CodeThrottled {
			continue
		}
		if !errors.Is(got, ErrThrottled) || errors.Is(got, ErrUniqueConflict) || got.Status != http.StatusConflict ||
			got.ExistingID != "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" || got.Field != "throttle" || got.Retryable() {
			t.Errorf("the throttled fixture decodes as %+v", got)
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

// The batch call's wire shapes: this package's types decode the contract's batch call
// and answer and encode them back unchanged, and the outcomes of handlers become
// entries shaped like the contract's.
func TestContractBatchShapes(t *testing.T) {
	var call batchCall
	roundTrip(t, "executor_batch_call", &call, true)
	if len(call.Tasks) != 2 || call.Tasks[0].IdempotencyKey != "order-42" || call.Tasks[1].Attempt != 2 ||
		call.Tasks[1].LeaseToken != "7f86d081884c7d657a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" ||
		call.Tasks[1].TraceParent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" ||
		!reflect.DeepEqual(normalized(t, call.Tasks[0].Payload), map[string]any{"to": "a@b.c"}) {
		t.Fatalf("executor_batch_call decodes as %+v", call)
	}
	if _, err := decodeBatch(fixture(t, "executor_batch_call")); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "executor_batch_answer", &batchAnswer{}, true)

	// An answer built from outcomes has the fixture's members, with the SDK's error text.
	got, err := json.Marshal(batchAnswer{Results: []batchResult{
		batchResultOf(call.Tasks[0].ID, taskOutcome{}),
		batchResultOf(call.Tasks[1].ID, taskOutcome{err: &RetryError{After: 30 * time.Second, Err: errors.New("downstream busy")}}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := normalized(t, fixture(t, "executor_batch_answer")).(map[string]any)
	want["results"].([]any)[1].(map[string]any)["error"] = "retry after 30s: downstream busy"
	if g := normalized(t, got); !reflect.DeepEqual(g, want) {
		t.Fatalf("answer encodes as\n%s\nwant\n%v", got, want)
	}
	for _, o := range []struct {
		outcome taskOutcome
		want    batchResult
	}{
		{taskOutcome{lease: 5 * time.Minute}, batchResult{ID: "x", Status: "accepted", Lease: "5m"}},
		{taskOutcome{err: &PermanentError{Err: errors.New("no such image")}}, batchResult{ID: "x", Status: "failed", Error: "no such image"}},
		{taskOutcome{err: errors.New("db down")}, batchResult{ID: "x", Status: "retry", Error: "db down"}},
		{taskOutcome{err: &RetryError{}}, batchResult{ID: "x", Status: "retry", Error: "retry"}},
		{taskOutcome{err: &noExecutorError{"t"}}, batchResult{ID: "x", Status: "retry", Error: `no executor for task type "t"`}},
	} {
		if got := batchResultOf("x", o.outcome); got != o.want {
			t.Errorf("%+v: %+v, want %+v", o.outcome, got, o.want)
		}
	}
	for _, bad := range []string{`not json`, `{}`, `{"tasks":null}`, `{"tasks":[{"id":"a"}]}`, `{"tasks":[{"type":"t"}]}`, `[]`} {
		if _, err := decodeBatch([]byte(bad)); !errors.Is(err, ErrMalformedBatch) {
			t.Errorf("decodeBatch(%s) = %v", bad, err)
		}
	}
}

// The signed batch call: its canonical string has the four per-task fields empty, Sign
// reproduces its signature, it verifies with the primary key and not once its body,
// timestamp or callback URL is changed, and its tasks are replays the second time.
func TestContractBatchSignature(t *testing.T) {
	var v struct {
		Body      string            `json:"body"`
		Canonical string            `json:"canonical"`
		Headers   map[string]string `json:"headers"`
		Keys      map[string]string `json:"keys"`
		Now       int64             `json:"now"`
	}
	if err := json.Unmarshal(fixture(t, "batch_signature"), &v); err != nil {
		t.Fatal(err)
	}
	header := func() http.Header {
		h := http.Header{}
		for k, val := range v.Headers {
			h.Set(k, val)
		}
		return h
	}
	primary := [][]byte{[]byte(v.Keys["primary"])}
	now := time.Unix(v.Now, 0)
	body := []byte(v.Body)
	if got := string(CanonicalString(header(), body)); got != v.Canonical {
		t.Fatalf("CanonicalString = %q, the contract %q", got, v.Canonical)
	}
	if got := Sign(primary, header(), body); got != v.Headers[HeaderSignature] {
		t.Fatalf("Sign = %s, the contract %s", got, v.Headers[HeaderSignature])
	}
	if err := VerifySignature(primary, header(), body, now); err != nil {
		t.Fatalf("the contract's batch call: %v", err)
	}
	// Per-task headers added to a batch call are not part of what it signs, so they
	// neither break it nor can be made to count.
	h := header()
	h.Set(HeaderTaskID, "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	h.Set(HeaderAttempt, "1")
	if got := string(CanonicalString(h, body)); got != v.Canonical {
		t.Fatalf("with per-task headers, CanonicalString = %q", got)
	}

	tamper := map[string]func(h http.Header, b []byte) (http.Header, []byte){
		"body": func(h http.Header, b []byte) (http.Header, []byte) {
			return h, bytes.Replace(b, []byte(`"attempt":2`), []byte(`"attempt":3`), 1)
		},
		"timestamp": func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(HeaderTimestamp, strconv.FormatInt(v.Now+1, 10))
			return h, b
		},
		"callback url": func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(HeaderCallbackURL, "http://evil.example:7700")
			return h, b
		},
	}
	for name, f := range tamper {
		th, tb := f(header(), append([]byte(nil), body...))
		if bytes.Equal(tb, body) && reflect.DeepEqual(th, header()) {
			t.Fatalf("%s: nothing tampered", name)
		}
		if err := VerifySignature(primary, th, tb, now); !errors.Is(err, ErrBadSignature) || errors.Is(err, ErrStaleTimestamp) {
			t.Errorf("tampered %s: %v, want a signature mismatch", name, err)
		}
		if _, err := NewVerifier(primary...).VerifyBatch(th, tb, now); err == nil {
			t.Errorf("tampered %s: VerifyBatch accepted it", name)
		}
	}
	if err := VerifySignature([][]byte{[]byte(v.Keys["secondary"])}, header(), body, now); !errors.Is(err, ErrBadSignature) {
		t.Errorf("the secondary key verified the primary's signature: %v", err)
	}

	verifier := NewVerifier(primary...)
	if err := verifier.Verify(header(), body, now); !errors.Is(err, ErrBatchCall) {
		t.Fatalf("Verify of a batch call = %v, want ErrBatchCall", err)
	}
	replayed, err := verifier.VerifyBatch(header(), body, now)
	if err != nil || len(replayed) != 2 || replayed[0] != nil || replayed[1] != nil {
		t.Fatalf("first delivery: %v, %v", replayed, err)
	}
	replayed, err = verifier.VerifyBatch(header(), body, now.Add(10*time.Second))
	if err != nil || len(replayed) != 2 || !errors.Is(replayed[0], ErrReplayed) || !errors.Is(replayed[1], ErrReplayed) {
		t.Fatalf("second delivery: %v, %v", replayed, err)
	}
	// A single call of a task the batch delivered is a replay too.
	single := http.Header{}
	single.Set(HeaderTimestamp, strconv.FormatInt(v.Now, 10))
	single.Set(HeaderTaskID, "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	single.Set(HeaderAttempt, "1")
	single.Set(HeaderLeaseToken, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
	single.Set(HeaderSignature, Sign(primary, single, []byte(`{}`)))
	if err := verifier.Verify(single, []byte(`{}`), now); !errors.Is(err, ErrReplayed) {
		t.Fatalf("the batch's task as a single call: %v, want a replay", err)
	}
	if _, err := NewVerifier(primary...).VerifyBatch(header(), body, now.Add(SignatureTolerance+time.Second)); !errors.Is(err, ErrStaleTimestamp) {
		t.Fatalf("late batch: %v", err)
	}
	// A signed body that is not a batch is refused as such, and nothing is recorded.
	h = header()
	h.Set(HeaderSignature, Sign(primary, h, []byte(`{"tasks":7}`)))
	if _, err := NewVerifier(primary...).VerifyBatch(h, []byte(`{"tasks":7}`), now); !errors.Is(err, ErrMalformedBatch) {
		t.Fatalf("signed garbage: %v", err)
	}
}

// checkContractSchedule: the members of schedule_response.json, typed.
func checkContractSchedule(t *testing.T, s *Schedule) {
	t.Helper()
	at := func(h, m, sec, ms int, day ...int) time.Time {
		d := 30
		if len(day) > 0 {
			d = day[0]
		}
		return time.Date(2026, 11, d, h, m, sec, ms*1e6, time.UTC)
	}
	if s.Job != "send-email" || s.Name != "weekly-42" || s.Type != "email" || s.Source != ScheduleSourceAPI ||
		s.Cron != "CRON_TZ=Europe/Berlin 0 9 * * MON" || s.Every != 0 || s.Priority != 3 || s.Overlap != OverlapBufferOne ||
		s.CatchUp == nil || *s.CatchUp != time.Hour || s.Jitter != 5*time.Minute || s.Paused ||
		s.StartAt == nil || !s.StartAt.Equal(at(7, 45, 0, 0)) || s.EndAt != nil ||
		s.NextFiring == nil || !s.NextFiring.Equal(at(8, 0, 0, 123)) ||
		s.LastFiring == nil || !s.LastFiring.Equal(at(7, 45, 0, 0, 23)) ||
		s.LastTaskID != "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b" || s.BufferedFiring != nil || s.Fired != 12 ||
		!s.CreatedAt.Equal(time.Date(2026, 9, 1, 7, 45, 0, 0, time.UTC)) || !s.UpdatedAt.Equal(at(7, 45, 0, 0, 29)) {
		t.Fatalf("the schedule decodes as %+v", s)
	}
	payload, ok := s.Payload.(json.RawMessage)
	if !ok || !reflect.DeepEqual(normalized(t, payload), map[string]any{"customer": 42.0, "week_of": "{{scheduled_at}}"}) {
		t.Fatalf("the schedule's payload decodes as %#v", s.Payload)
	}
}
