package asyncd_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// fakeAPI records requests and answers with a canned status and body.
type fakeAPI struct {
	mu     sync.Mutex
	reqs   []recorded
	status int
	body   string
	header http.Header
}

type recorded struct {
	method, path, query string
	header              http.Header
	body                map[string]any
	// rawPath is the path as sent, its escapes kept.
	rawPath string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body, r.URL.EscapedPath()})
	status, resp, header := f.status, f.body, f.header
	f.mu.Unlock()
	for k, v := range header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, resp)
}

func (f *fakeAPI) last(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		t.Fatal("no request reached the fake API")
	}
	return f.reqs[len(f.reqs)-1]
}

func newFake(t *testing.T, status int, body string) (*fakeAPI, *asyncd.Client) {
	t.Helper()
	f := &fakeAPI{status: status, body: body}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, asyncd.NewClient(asyncd.WithEndpoint(srv.URL+"/"), asyncd.WithServiceName("orders"))
}

func TestSubmitSendsContractBody(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"0193a","eta":"2026-11-30T06:00:00.123Z","route":"store","duplicate":false}`)
	res, err := c.SubmitDelayed(context.Background(), &asyncd.Task{
		Type:           "send_email",
		Payload:        map[string]any{"to": "a@b.c"},
		IdempotencyKey: "k1",
		UniqueKey:      "u1",
		Priority:       5,
		MaxRetries:     asyncd.Retries(0),
		Timeout:        1500 * time.Millisecond,
		DependsOn:      []string{"0193x"},
	}, 90*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 11, 30, 6, 0, 0, 123e6, time.UTC)
	if res.ID != "0193a" || !res.ETA.Equal(want) || res.Route != "store" || res.Duplicate {
		t.Fatalf("result = %+v", res)
	}
	r := f.last(t)
	if r.method != "POST" || r.path != "/v1/tasks" {
		t.Fatalf("%s %s", r.method, r.path)
	}
	if got := r.header.Get("Asyncd-Source-Service"); got != "orders" {
		t.Fatalf("source service header = %q", got)
	}
	b := r.body
	checks := map[string]any{
		"type": "send_email", "delay": "1h 30m", "priority": 5.0, "idempotency_key": "k1",
		"unique_key": "u1", "max_retries": 0.0, "timeout": "1s 500ms", "source_service": "orders",
	}
	for k, v := range checks {
		if b[k] != v {
			t.Errorf("body[%s] = %#v, want %#v", k, b[k], v)
		}
	}
	if _, ok := b["eta"]; ok {
		t.Error("eta sent along with delay")
	}
	if p := b["payload"].(map[string]any); p["to"] != "a@b.c" {
		t.Errorf("payload = %v", p)
	}
	if d := b["depends_on"].([]any); len(d) != 1 || d[0] != "0193x" {
		t.Errorf("depends_on = %v", d)
	}
}

func TestSubmitAtSendsUTCMillis(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"a","eta":"2026-12-01T00:00:00.5Z","route":"store"}`)
	loc := time.FixedZone("x", 8*3600)
	_, err := c.SubmitAt(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"},
		time.Date(2026, 12, 1, 8, 0, 0, 500e6, loc))
	if err != nil {
		t.Fatal(err)
	}
	b := f.last(t).body
	if b["eta"] != "2026-12-01T00:00:00.500Z" {
		t.Fatalf("eta = %v", b["eta"])
	}
	if _, ok := b["delay"]; ok {
		t.Fatal("delay sent along with eta")
	}
	if _, ok := b["max_retries"]; ok {
		t.Fatal("max_retries sent though unset")
	}
	if b["payload"] != nil {
		t.Fatalf("payload = %v, want null", b["payload"])
	}
}

func TestSubmitRawPayloadPassesThrough(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"a","eta":"2026-12-01T00:00:00Z","route":"kafka"}`)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k", Payload: json.RawMessage(`{"n":1.50}`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := f.last(t).body["payload"].(map[string]any); p["n"] != 1.5 {
		t.Fatalf("payload = %v", p)
	}
}

func TestSubmitRefusesMissingIdempotencyKeyBeforeSending(t *testing.T) {
	f, c := newFake(t, 201, `{}`)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", Payload: 1})
	if !errors.Is(err, asyncd.ErrMissingIdempotencyKey) {
		t.Fatalf("err = %v", err)
	}
	_, err = c.SubmitBatch(context.Background(), []*asyncd.Task{{Type: "t", IdempotencyKey: "k"}, {Type: "t"}})
	if !errors.Is(err, asyncd.ErrMissingIdempotencyKey) || !strings.Contains(err.Error(), "task 1") {
		t.Fatalf("batch err = %v", err)
	}
	if _, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k", Delay: time.Second, ETA: time.Now()}); err == nil {
		t.Fatal("delay and eta together accepted")
	}
	if _, err := c.SubmitDelayed(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"}, -time.Second); err == nil {
		t.Fatal("negative delay accepted")
	}
	if len(f.reqs) != 0 {
		t.Fatalf("%d requests sent", len(f.reqs))
	}
}

// ExpiresAt goes out as UTC milliseconds, StartWithin as humantime, each only when set;
// the status's expires_at is read back, and nil when the task never expires.
func TestSubmitSendsExpiry(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"a","eta":"2026-12-01T00:00:00Z","route":"store"}`)
	at := time.Date(2026, 12, 1, 8, 30, 0, 250e6, time.FixedZone("x", 8*3600))
	if _, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k", ExpiresAt: at}); err != nil {
		t.Fatal(err)
	}
	b := f.last(t).body
	if b["expires_at"] != "2026-12-01T00:30:00.250Z" {
		t.Fatalf("expires_at = %v", b["expires_at"])
	}
	if _, ok := b["start_within"]; ok {
		t.Fatal("start_within sent though unset")
	}
	if _, err := c.SubmitDelayed(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k", StartWithin: 90 * time.Second}, time.Hour); err != nil {
		t.Fatal(err)
	}
	b = f.last(t).body
	if b["start_within"] != "1m 30s" || b["delay"] != "1h" {
		t.Fatalf("start_within = %v, delay = %v", b["start_within"], b["delay"])
	}
	if _, ok := b["expires_at"]; ok {
		t.Fatal("expires_at sent though unset")
	}
	f.body = `{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z","route":"store"},` +
		`{"status":201,"id":"b","eta":"2026-12-01T00:00:00Z","route":"store"}]}`
	if _, err := c.SubmitBatch(context.Background(), []*asyncd.Task{
		{Type: "t", IdempotencyKey: "k1", StartWithin: 10 * time.Minute},
		{Type: "t", IdempotencyKey: "k2"},
	}); err != nil {
		t.Fatal(err)
	}
	items := f.last(t).body["tasks"].([]any)
	if items[0].(map[string]any)["start_within"] != "10m" {
		t.Fatalf("batch item 0 = %v", items[0])
	}
	for _, k := range []string{"start_within", "expires_at"} {
		if _, ok := items[1].(map[string]any)[k]; ok {
			t.Fatalf("batch item 1 carries %s though unset: %v", k, items[1])
		}
	}

	f.body = `{"id":"a","state":"expired","eta":"2026-12-01T00:00:00Z","expires_at":"2026-12-01T00:00:01.5Z"}`
	st, err := c.Get(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != asyncd.StateExpired || st.ExpiresAt == nil || !st.ExpiresAt.Equal(time.Date(2026, 12, 1, 0, 0, 1, 500e6, time.UTC)) {
		t.Fatalf("status = %+v (expires_at %v)", st, st.ExpiresAt)
	}
	f.body = `{"id":"a","state":"pending","eta":"2026-12-01T00:00:00Z"}`
	if st, err := c.Get(context.Background(), "a"); err != nil || st.ExpiresAt != nil {
		t.Fatalf("status without expires_at = %+v, %v", st, err)
	}
}

// A task with both ExpiresAt and StartWithin is refused by the SDK before anything is
// sent, alone or in a batch (SubmitDelayed and SubmitAt keep both, so they refuse it
// too); so is a negative StartWithin.
func TestSubmitRefusesBothExpiriesBeforeSending(t *testing.T) {
	f, c := newFake(t, 201, `{}`)
	bg := context.Background()
	both := &asyncd.Task{Type: "t", IdempotencyKey: "k", ExpiresAt: time.Now().Add(time.Hour), StartWithin: time.Minute}
	calls := []struct {
		name   string
		submit func() error
		want   []string // what the error must name
	}{
		{"Submit", func() error { _, err := c.Submit(bg, both); return err }, []string{"ExpiresAt", "StartWithin"}},
		{"SubmitDelayed", func() error { _, err := c.SubmitDelayed(bg, both, time.Minute); return err }, []string{"ExpiresAt", "StartWithin"}},
		{"SubmitAt", func() error { _, err := c.SubmitAt(bg, both, time.Now().Add(time.Minute)); return err }, []string{"ExpiresAt", "StartWithin"}},
		{"SubmitBatch", func() error {
			_, err := c.SubmitBatch(bg, []*asyncd.Task{{Type: "t", IdempotencyKey: "k0"}, both})
			return err
		}, []string{"task 1", "ExpiresAt", "StartWithin"}},
		{"negative StartWithin", func() error {
			_, err := c.Submit(bg, &asyncd.Task{Type: "t", IdempotencyKey: "k", StartWithin: -time.Second})
			return err
		}, []string{"StartWithin"}},
	}
	for _, call := range calls {
		err := call.submit()
		var apiErr *asyncd.APIError
		if err == nil || errors.As(err, &apiErr) {
			t.Errorf("%s: err = %v, want the SDK's own refusal", call.name, err)
			continue
		}
		for _, w := range call.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %q does not name %s", call.name, err, w)
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != 0 {
		t.Fatalf("%d requests sent", len(f.reqs))
	}
}

func TestAPIErrorCarriesCodeFieldStatus(t *testing.T) {
	_, c := newFake(t, 409, `{"error":{"code":"unique_conflict","message":"order:42 is pending","field":"unique_key","existing_id":"0193e"}}`)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %T %v", err, err)
	}
	if apiErr.Status != 409 || apiErr.Code != asyncd.CodeUniqueConflict || apiErr.Field != "unique_key" || apiErr.ExistingID != "0193e" {
		t.Fatalf("%+v", apiErr)
	}
	if !errors.Is(err, asyncd.ErrUniqueConflict) || errors.Is(err, asyncd.ErrNotFound) {
		t.Fatal("errors.Is by code is wrong")
	}
	if !strings.Contains(err.Error(), "unique_conflict") || !strings.Contains(err.Error(), "order:42 is pending") {
		t.Fatalf("message %q", err.Error())
	}
}

func TestAPIErrorTopLevelStateAndNonJSONBodies(t *testing.T) {
	_, c := newFake(t, 409, `{"error":{"code":"not_cancellable","message":"task is running"},"state":"running"}`)
	err := c.Cancel(context.Background(), "x")
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) || apiErr.State != "running" || !errors.Is(err, asyncd.ErrNotCancellable) {
		t.Fatalf("err = %v (%+v)", err, apiErr)
	}
	_, c = newFake(t, 502, `<html>bad gateway</html>`)
	_, err = c.Get(context.Background(), "x")
	if !errors.As(err, &apiErr) || apiErr.Status != 502 || apiErr.Code != asyncd.CodeHTTPError || !strings.Contains(apiErr.Message, "bad gateway") {
		t.Fatalf("err = %v", err)
	}
}

func TestBatchGetDeadLettersRedrive(t *testing.T) {
	f, c := newFake(t, 200, `{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false},
		{"status":400,"error":{"code":"unknown_task_type","message":"no job","field":"type"}}]}`)
	res, err := c.SubmitBatch(context.Background(), []*asyncd.Task{
		{Type: "t", IdempotencyKey: "k1", Delay: time.Minute},
		{Type: "nope", IdempotencyKey: "k2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != 201 || res[0].ID != "a" || res[0].Err != nil {
		t.Fatalf("item 0 = %+v", res[0])
	}
	if res[1].Err == nil || !errors.Is(res[1].Err, asyncd.ErrUnknownTaskType) || res[1].Err.Field != "type" || res[1].Err.Status != 400 {
		t.Fatalf("item 1 = %+v", res[1])
	}
	r := f.last(t)
	if r.path != "/v1/tasks:batch" || len(r.body["tasks"].([]any)) != 2 {
		t.Fatalf("%s %v", r.path, r.body)
	}
	if r.body["tasks"].([]any)[0].(map[string]any)["delay"] != "1m" {
		t.Fatalf("batch delay: %v", r.body)
	}

	task := `{"id":"a","type":"t","payload":{"x":1},"state":"dead","priority":0,"eta":"2026-12-01T00:00:00.000Z",
		"attempt":4,"max_retries":3,"idempotency_key":"k","unique_key":null,"depends_on":[],"last_error":"boom",
		"result":null,"created_at":"2026-11-30T00:00:00.000Z","updated_at":"2026-11-30T00:00:01.000Z"}`
	f.body = `{"items":[` + task + `]}`
	items, err := c.DeadLetters(context.Background(), "t", 5)
	if err != nil {
		t.Fatal(err)
	}
	r = f.last(t)
	if r.path != "/v1/dead-letters" || r.query != "limit=5&type=t" {
		t.Fatalf("%s?%s", r.path, r.query)
	}
	if len(items) != 1 || items[0].State != asyncd.StateDead || items[0].LastError != "boom" || items[0].IdempotencyKey != "k" ||
		items[0].UniqueKey != "" || items[0].Attempt != 4 || string(items[0].Payload) != `{"x":1}` {
		t.Fatalf("items = %+v", items)
	}

	f.body = task
	got, err := c.Get(context.Background(), "a/b")
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxRetries != 3 || got.UpdatedAt.Sub(got.CreatedAt) != time.Second {
		t.Fatalf("get = %+v", got)
	}
	if r := f.last(t); r.method != "GET" || r.path != "/v1/tasks/a/b" {
		// a/b is escaped on the wire; the server's router sees the decoded path
		t.Fatalf("%s %s", r.method, r.path)
	}

	f.body = `{"id":"a","state":"pending","eta":"2026-12-01T00:00:00.000Z"}`
	rd, err := c.Redrive(context.Background(), "a")
	if err != nil || rd.State != "pending" || rd.ID != "a" {
		t.Fatalf("redrive = %+v, %v", rd, err)
	}
	if r := f.last(t); r.method != "POST" || r.path != "/v1/dead-letters/a/redrive" {
		t.Fatalf("%s %s", r.method, r.path)
	}

	f.body = `{"job":"j","task_type":"t","paused":true,"paused_at":"2026-12-01T00:00:00.000Z","paused_by_config":false}`
	job, err := c.PauseJob(context.Background(), "j")
	if err != nil || !job.Paused || job.PausedAt == nil || job.TaskType != "t" {
		t.Fatalf("pause = %+v, %v", job, err)
	}
	if r := f.last(t); r.method != "POST" || r.path != "/v1/jobs/j/pause" {
		t.Fatalf("%s %s", r.method, r.path)
	}
	f.body = `{"job":"j","task_type":"t","paused":false,"paused_at":null,"paused_by_config":false}`
	job, err = c.ResumeJob(context.Background(), "j")
	if err != nil || job.Paused || job.PausedAt != nil {
		t.Fatalf("resume = %+v, %v", job, err)
	}
	if r := f.last(t); r.method != "POST" || r.path != "/v1/jobs/j/resume" {
		t.Fatalf("%s %s", r.method, r.path)
	}

	f.body = `{"items":[` + task + `],"truncated":false,"next_cursor":"c2"}`
	page, err := c.SearchTasks(context.Background(), asyncd.SearchFilter{Job: "j", State: asyncd.StateDead,
		CreatedAfter: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Limit: 2, Cursor: "c1"})
	if err != nil || len(page.Items) != 1 || page.NextCursor != "c2" || page.Items[0].ID != "a" {
		t.Fatalf("search = %+v, %v", page, err)
	}
	if r := f.last(t); r.method != "GET" || r.path != "/v1/tasks" ||
		r.query != "created_after=2026-12-01T00%3A00%3A00Z&cursor=c1&job=j&limit=2&state=dead" {
		t.Fatalf("%s %s?%s", r.method, r.path, r.query)
	}

	f.body = `{"matched":3,"affected":2,"skipped":0,"remaining":1,"dry_run":false,"dead_before":"2026-12-01T00:00:00.000Z"}`
	bulk, err := c.RedriveDeadLetters(context.Background(), asyncd.DeadLetterFilter{Job: "j", ErrorPrefix: "boom", Limit: 2})
	if err != nil || bulk.Affected != 2 || bulk.Remaining != 1 || bulk.DeadBefore.IsZero() {
		t.Fatalf("bulk redrive = %+v, %v", bulk, err)
	}
	if r := f.last(t); r.method != "POST" || r.path != "/v1/dead-letters/redrive" ||
		!reflect.DeepEqual(r.body, map[string]any{"job": "j", "error_prefix": "boom", "limit": 2.0}) {
		t.Fatalf("%s %s %v", r.method, r.path, r.body)
	}
	if _, err := c.PurgeDeadLetters(context.Background(), asyncd.DeadLetterFilter{Type: "t", DeadBefore: &bulk.DeadBefore}); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.path != "/v1/dead-letters/purge" || r.body["dead_before"] != "2026-12-01T00:00:00Z" {
		t.Fatalf("%s %v", r.path, r.body)
	}

	f.body = `{"id":"a","state":"cancelled"}`
	if err := c.Cancel(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.method != "DELETE" || r.path != "/v1/tasks/a" || r.query != "" {
		t.Fatalf("%s %s?%s", r.method, r.path, r.query)
	}
	if err := c.Cancel(context.Background(), "a/b", asyncd.CancelInJob("j 1")); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.method != "DELETE" || r.path != "/v1/tasks/a/b" || r.query != "job=j+1" {
		t.Fatalf("%s %s?%s", r.method, r.path, r.query)
	}

	f.body = `{"id":"b","state":"cancelled"}`
	byKey, err := c.CancelUnique(context.Background(), "j 1", "order:7")
	if err != nil || byKey.ID != "b" || byKey.State != asyncd.StateCancelled {
		t.Fatalf("cancel unique = %+v, %v", byKey, err)
	}
	if r := f.last(t); r.method != "DELETE" || r.path != "/v1/tasks" || r.query != "job=j+1&unique_key=order%3A7" {
		t.Fatalf("%s %s?%s", r.method, r.path, r.query)
	}

	f.status, f.body = 201, `{"id":"t1","job":"j","entry":"nightly","type":"report","eta":"2026-11-30T06:00:00.000Z"}`
	fired, err := c.TriggerCron(context.Background(), "j", "night ly")
	if err != nil || fired.ID != "t1" || fired.Entry != "nightly" || fired.Type != "report" ||
		!fired.ETA.Equal(time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)) {
		t.Fatalf("trigger = %+v, %v", fired, err)
	}
	if r := f.last(t); r.method != "POST" || r.path != "/v1/jobs/j/cron/night ly/trigger" {
		t.Fatalf("%s %s", r.method, r.path)
	}
	f.status, f.body = 404, `{"error":{"code":"not_found","message":"job \"j\" has no cron entry \"x\"","field":"entry"}}`
	_, err = c.TriggerCron(context.Background(), "j", "x")
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) || !errors.Is(err, asyncd.ErrNotFound) || apiErr.Field != "entry" {
		t.Fatalf("trigger of an unknown entry: %v", err)
	}
}

// ChangeInJob names the job in the query (escaped) and sends Change's body; a 202 is the
// change recorded for a task not consumed yet, a 200 the stored task changed.
func TestChangeInJob(t *testing.T) {
	f, c := newFake(t, 202, `{"id":"a/b","job":"j 1","type":"t","consumed":false}`)
	five := 5
	res, err := c.ChangeInJob(context.Background(), "j 1&x=y", "a/b", asyncd.Change{Payload: map[string]any{"v": 2}, Priority: &five})
	if err != nil || res.Task != nil || res.Pending == nil ||
		*res.Pending != (asyncd.PendingChange{ID: "a/b", Job: "j 1", Type: "t", Consumed: false}) {
		t.Fatalf("change in job = %+v, %v", res, err)
	}
	r := f.last(t)
	if r.method != "PATCH" || r.rawPath != "/v1/tasks/a%2Fb" || r.query != "job=j+1%26x%3Dy" ||
		!reflect.DeepEqual(r.body, map[string]any{"payload": map[string]any{"v": 2.0}, "priority": 5.0}) {
		t.Fatalf("%s %s?%s %v", r.method, r.rawPath, r.query, r.body)
	}

	f.status, f.body = 200, `{"id":"a","type":"t","payload":{"v":2},"state":"pending","priority":5,"eta":"2026-12-01T00:00:00.000Z",
		"attempt":0,"max_retries":3,"idempotency_key":null,"unique_key":null,"depends_on":[],"last_error":null,
		"result":null,"created_at":"2026-11-30T00:00:00.000Z","updated_at":"2026-11-30T00:00:01.000Z"}`
	res, err = c.ChangeInJob(context.Background(), "j", "a", asyncd.Change{RunNow: true})
	if err != nil || res.Pending != nil || res.Task == nil || res.Task.ID != "a" || res.Task.Priority != 5 || res.Task.State != asyncd.StatePending {
		t.Fatalf("change in job of a stored task = %+v, %v", res, err)
	}
	if r := f.last(t); r.path != "/v1/tasks/a" || r.query != "job=j" || !reflect.DeepEqual(r.body, map[string]any{"run_now": true}) {
		t.Fatalf("%s?%s %v", r.path, r.query, r.body)
	}

	f.status, f.body = 400, `{"error":{"code":"invalid_field","message":"the job renders its keys from the payload","field":"payload"}}`
	_, err = c.ChangeInJob(context.Background(), "j", "a", asyncd.Change{Payload: 1})
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) || !errors.Is(err, asyncd.ErrInvalidField) || apiErr.Field != "payload" {
		t.Fatalf("a refused change: %v", err)
	}

	// Change's checks, and a job is required: nothing is sent.
	f.mu.Lock()
	sent := len(f.reqs)
	f.mu.Unlock()
	for _, bad := range []struct {
		job    string
		change asyncd.Change
	}{
		{"j", asyncd.Change{Delay: time.Minute, ETA: time.Now()}},
		{"j", asyncd.Change{Delay: -time.Second}},
		{"", asyncd.Change{RunNow: true}},
	} {
		if _, err := c.ChangeInJob(context.Background(), bad.job, "a", bad.change); err == nil {
			t.Fatalf("ChangeInJob(%q, %+v) was sent", bad.job, bad.change)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != sent {
		t.Fatalf("%d requests sent for refused changes", len(f.reqs)-sent)
	}
}
