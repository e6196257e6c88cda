package asyncd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Schedules (docs/api.md, "Schedules"): a job's tasks fired on a cron or at a fixed
// interval, like a spec.cron entry of its AsyncJobConfig, but created, changed and
// deleted at runtime through /v1/schedules — one per customer, by the hundred thousand.

// MaxSchedulePage is the most schedules one ListSchedules page holds (the server's
// default is 100).
const MaxSchedulePage = 1000

// MaxBackfill is the most firings one BackfillSchedule creates; a longer range is
// refused (ErrInvalidField, Field "to"): backfill it in parts.
const MaxBackfill = 10_000

// Overlap says what a schedule's firing does while the previous firing has not finished
// (it is pending, running or waiting to retry).
type Overlap string

// Overlap policies.
const (
	// OverlapAllow runs the firing anyway (the default; the API also reads "AllowAll").
	OverlapAllow Overlap = "Allow"
	// OverlapSkip skips the firing.
	OverlapSkip Overlap = "Skip"
	// OverlapBufferOne holds the firing back (Schedule.BufferedFiring) and creates it, due
	// at once, as soon as the previous one finishes; at most one is held, a further firing
	// meanwhile is skipped.
	OverlapBufferOne Overlap = "BufferOne"
	// OverlapCancelOther cancels the previous firing (a running attempt's outcome is then
	// ignored) and creates the new one.
	OverlapCancelOther Overlap = "CancelOther"
)

// Schedule sources (Schedule.Source).
const (
	// ScheduleSourceAPI: created through /v1/schedules.
	ScheduleSourceAPI = "api"
	// ScheduleSourceConfig: an entry of the job's spec.cron, read-only here
	// (ErrScheduleReadOnly) but it can be triggered and backfilled.
	ScheduleSourceConfig = "config"
)

// ScheduleSpec is what a schedule does: when it fires and what each firing is. Set
// exactly one of Cron and Every; every other field is optional, its zero value the
// API's default.
type ScheduleSpec struct {
	// Cron is "CRON_TZ=Area/City" and a 5- or 6-field expression (the zone is
	// mandatory), e.g. "CRON_TZ=Europe/Berlin 0 9 * * MON". ValidateCron checks it.
	Cron string
	// Every is a fixed interval (at least a second), counted from StartAt or else from
	// the schedule's creation. Sent in humantime form ("1m 30s").
	Every time.Duration
	// Payload is each firing's payload, marshalled with encoding/json (a json.RawMessage
	// is sent as is; in a Schedule the API answered, it is a json.RawMessage). In its
	// strings, {{scheduled_at}} becomes the firing's instant (RFC 3339, UTC, ms) and
	// {{schedule}} the schedule's name.
	Payload any
	// Priority 0..9 of each firing.
	Priority int
	// Overlap is what a firing does while the previous one has not finished; empty
	// sends none (OverlapAllow).
	Overlap Overlap
	// CatchUp is how far back firings missed while no scheduler could write them are
	// still created (they run at once), up to 7 days; CatchUpFor(0) for none. Nil
	// takes the default, an hour.
	CatchUp *time.Duration
	// StartAt and EndAt, when set: no firing before, none after (then the schedule has
	// ended).
	StartAt *time.Time
	EndAt   *time.Time
	// Jitter makes each firing due up to this much after its instant (at most an hour,
	// and at most Every) — the same delay for the same firing on every scheduler, so that
	// many schedules on one cron do not fall due in the same millisecond. 0: none.
	Jitter time.Duration
	// Paused: the schedule creates no firings.
	Paused bool
}

// CatchUpFor returns a pointer to d, for ScheduleSpec.CatchUp; CatchUpFor(0) creates no
// missed firings.
func CatchUpFor(d time.Duration) *time.Duration { return &d }

// Schedule is a schedule as /v1/schedules answers it: its ScheduleSpec and where it
// stands.
type Schedule struct {
	// Job is its AsyncJobConfig's name, Name unique within the job, Type the job's task
	// type.
	Job  string
	Name string
	Type string
	// Source is ScheduleSourceAPI or ScheduleSourceConfig (a spec.cron entry).
	Source string
	ScheduleSpec
	// NextFiring is the next firing not yet created; nil while the schedule is paused,
	// has ended, or has not been planned by a scheduler yet.
	NextFiring *time.Time
	// LastFiring is the instant of the latest firing created (for a schedule that allows
	// overlaps, up to a minute ahead), LastTaskID its task; nil and "" before the first.
	LastFiring *time.Time
	LastTaskID string
	// BufferedFiring is, under OverlapBufferOne, the instant of the firing held back until
	// the previous one finishes.
	BufferedFiring *time.Time
	// Fired counts the tasks its firings created.
	Fired     uint64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// SchedulePage is one page of ListSchedules, by name. NextCursor is set while there may
// be more: pass it as the cursor of the next call.
type SchedulePage struct {
	Items      []Schedule `json:"items"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// BackfillResult is the answer to BackfillSchedule: the firings in the range, and of
// those the ones this call created (the rest existed already).
type BackfillResult struct {
	Firings uint64 `json:"firings"`
	Created uint64 `json:"created"`
}

// SchedulePatch is what ChangeSchedule changes: members of the spec by their API names
// ("cron", "every", "payload", "priority", "overlap", "catch_up", "start_at", "end_at",
// "jitter", "paused"). Each replaces the schedule's; a nil value sends null, which
// clears the member (back to its default); giving "cron" drops "every" and the reverse.
// time.Duration values are sent in humantime form and time.Time values as RFC 3339
// (UTC, milliseconds), as ScheduleSpec's are; any other value is marshalled with
// encoding/json.
type SchedulePatch map[string]any

// specWire is a ScheduleSpec as the API reads and writes it.
type specWire struct {
	Cron     string          `json:"cron,omitempty"`
	Every    string          `json:"every,omitempty"`
	Payload  json.RawMessage `json:"payload"`
	Priority int             `json:"priority"`
	Overlap  Overlap         `json:"overlap,omitempty"`
	CatchUp  string          `json:"catch_up,omitempty"`
	StartAt  string          `json:"start_at,omitempty"`
	EndAt    string          `json:"end_at,omitempty"`
	Jitter   string          `json:"jitter,omitempty"`
	Paused   bool            `json:"paused"`
}

func (s *ScheduleSpec) wire() (specWire, error) {
	payload, err := marshalPayload(s.Payload)
	if err != nil {
		return specWire{}, err
	}
	w := specWire{Cron: s.Cron, Payload: payload, Priority: s.Priority, Overlap: s.Overlap, Paused: s.Paused}
	if s.Every != 0 {
		w.Every = formatDuration(s.Every)
	}
	if s.CatchUp != nil {
		w.CatchUp = formatDuration(*s.CatchUp)
	}
	if s.StartAt != nil {
		w.StartAt = formatTime(*s.StartAt)
	}
	if s.EndAt != nil {
		w.EndAt = formatTime(*s.EndAt)
	}
	if s.Jitter != 0 {
		w.Jitter = formatDuration(s.Jitter)
	}
	return w, nil
}

func (s *ScheduleSpec) fromWire(w specWire) error {
	*s = ScheduleSpec{Cron: w.Cron, Priority: w.Priority, Overlap: w.Overlap, Paused: w.Paused}
	if w.Payload != nil {
		s.Payload = w.Payload
	}
	var err error
	if w.Every != "" {
		if s.Every, err = parseDuration(w.Every); err != nil {
			return fmt.Errorf("every: %w", err)
		}
	}
	if w.CatchUp != "" {
		d, err := parseDuration(w.CatchUp)
		if err != nil {
			return fmt.Errorf("catch_up: %w", err)
		}
		s.CatchUp = &d
	}
	if w.Jitter != "" {
		if s.Jitter, err = parseDuration(w.Jitter); err != nil {
			return fmt.Errorf("jitter: %w", err)
		}
	}
	for _, t := range []struct {
		name, v string
		to      **time.Time
	}{{"start_at", w.StartAt, &s.StartAt}, {"end_at", w.EndAt, &s.EndAt}} {
		if t.v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, t.v)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		*t.to = &at
	}
	return nil
}

// MarshalJSON writes the spec as the API reads it (the body of PutSchedule).
func (s ScheduleSpec) MarshalJSON() ([]byte, error) {
	w, err := s.wire()
	if err != nil {
		return nil, err
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the spec as the API writes it.
func (s *ScheduleSpec) UnmarshalJSON(b []byte) error {
	var w specWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if err := s.fromWire(w); err != nil {
		return fmt.Errorf("asyncd: schedule spec: %w", err)
	}
	return nil
}

// scheduleWire is a Schedule as the API writes it.
type scheduleWire struct {
	Job    string `json:"job"`
	Name   string `json:"name"`
	Type   string `json:"type"`
	Source string `json:"source"`
	specWire
	NextFiring     *time.Time `json:"next_firing"`
	LastFiring     *time.Time `json:"last_firing"`
	LastTaskID     *string    `json:"last_task_id"`
	BufferedFiring *time.Time `json:"buffered_firing"`
	Fired          uint64     `json:"fired"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

// MarshalJSON writes the schedule as the API does.
func (s Schedule) MarshalJSON() ([]byte, error) {
	spec, err := s.ScheduleSpec.wire()
	if err != nil {
		return nil, err
	}
	w := scheduleWire{Job: s.Job, Name: s.Name, Type: s.Type, Source: s.Source, specWire: spec,
		NextFiring: s.NextFiring, LastFiring: s.LastFiring, BufferedFiring: s.BufferedFiring,
		Fired: s.Fired, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
	if s.LastTaskID != "" {
		w.LastTaskID = &s.LastTaskID
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the schedule as the API writes it.
func (s *Schedule) UnmarshalJSON(b []byte) error {
	var w scheduleWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = Schedule{Job: w.Job, Name: w.Name, Type: w.Type, Source: w.Source,
		NextFiring: w.NextFiring, LastFiring: w.LastFiring, LastTaskID: deref(w.LastTaskID),
		BufferedFiring: w.BufferedFiring, Fired: w.Fired, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
	if err := s.ScheduleSpec.fromWire(w.specWire); err != nil {
		return fmt.Errorf("asyncd: schedule %s of job %s: %w", w.Name, w.Job, err)
	}
	return nil
}

// scheduleCreate is the body of POST /v1/schedules: the spec with its job and name.
type scheduleCreate struct {
	Job  string
	Name string
	Spec ScheduleSpec
}

func (c scheduleCreate) MarshalJSON() ([]byte, error) {
	spec, err := c.Spec.wire()
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Job  string `json:"job"`
		Name string `json:"name"`
		specWire
	}{c.Job, c.Name, spec})
}

func (c *scheduleCreate) UnmarshalJSON(b []byte) error {
	var w struct {
		Job  string `json:"job"`
		Name string `json:"name"`
		specWire
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	c.Job, c.Name = w.Job, w.Name
	return c.Spec.fromWire(w.specWire)
}

// wire renders the patch's time.Duration and time.Time values as the API reads them.
func (p SchedulePatch) wire() (map[string]any, error) {
	if len(p) == 0 {
		return nil, errors.New("asyncd: empty schedule patch")
	}
	out := make(map[string]any, len(p))
	for k, v := range p {
		switch v := v.(type) {
		case time.Duration:
			out[k] = formatDuration(v)
		case *time.Duration:
			if v == nil {
				out[k] = nil
			} else {
				out[k] = formatDuration(*v)
			}
		case time.Time:
			out[k] = formatTime(v)
		case *time.Time:
			if v == nil {
				out[k] = nil
			} else {
				out[k] = formatTime(*v)
			}
		case json.RawMessage:
			if v != nil && !json.Valid(v) {
				return nil, fmt.Errorf("asyncd: patch member %s is not valid JSON", k)
			}
			out[k] = v
		default:
			out[k] = v
		}
	}
	return out, nil
}

// schedulePath is /v1/schedules/{job}/{name} followed by rest, its segments escaped.
func schedulePath(job, name, rest string) string {
	return "/v1/schedules/" + url.PathEscape(job) + "/" + url.PathEscape(name) + rest
}

// CreateSchedule creates the schedule name of job (its AsyncJobConfig's name) with spec
// (POST /v1/schedules). A name the job already has a schedule of is an error matching
// ErrScheduleExists (Field "name"): PutSchedule writes over it instead. A spec the
// server refuses matches ErrInvalidField naming the member ("cron", "every", "jitter",
// …); a job no config declares matches ErrNotFound, Field "job".
//
// Under WithRetry, a create that was stored but whose answer was lost comes back
// ErrScheduleExists from its retry; PutSchedule is safe to repeat.
func (c *Client) CreateSchedule(ctx context.Context, job, name string, spec ScheduleSpec) (*Schedule, error) {
	var s Schedule
	body := scheduleCreate{Job: job, Name: name, Spec: spec}
	if err := c.do(ctx, http.MethodPost, "/v1/schedules", body, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// PutSchedule creates the schedule name of job, or writes spec over it
// (PUT /v1/schedules/{job}/{name}): an upsert, for a caller that keeps one schedule per
// customer without knowing which exist. created says whether it was created (201)
// rather than written over (200). A job's spec.cron entry matches ErrScheduleReadOnly.
func (c *Client) PutSchedule(ctx context.Context, job, name string, spec ScheduleSpec) (s *Schedule, created bool, err error) {
	var res Schedule
	status, err := c.doStatus(ctx, http.MethodPut, schedulePath(job, name, ""), spec, &res)
	if err != nil {
		return nil, false, err
	}
	return &res, status == http.StatusCreated, nil
}

// GetSchedule returns the schedule name of job (GET /v1/schedules/{job}/{name}); an
// error matching ErrNotFound when the job has none of that name (Field "name"; "job"
// for a job no config declares).
func (c *Client) GetSchedule(ctx context.Context, job, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodGet, schedulePath(job, name, ""), nil)
}

// ListSchedules returns one page of job's schedules, by name, its spec.cron entries
// among them (Source ScheduleSourceConfig): at most limit (1..MaxSchedulePage; 0 takes
// the server's default, 100), after cursor, a previous page's NextCursor ("" for the
// first page). WalkSchedules goes through every page.
func (c *Client) ListSchedules(ctx context.Context, job, cursor string, limit int) (*SchedulePage, error) {
	q := url.Values{"job": {job}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var page SchedulePage
	if err := c.do(ctx, http.MethodGet, "/v1/schedules?"+q.Encode(), nil, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// WalkSchedules calls fn with each of job's schedules, by name, reading them a page of
// MaxSchedulePage at a time. It stops at the first error, of a call or of fn, and
// returns it.
func (c *Client) WalkSchedules(ctx context.Context, job string, fn func(*Schedule) error) error {
	cursor := ""
	for {
		page, err := c.ListSchedules(ctx, job, cursor, MaxSchedulePage)
		if err != nil {
			return err
		}
		for i := range page.Items {
			if err := fn(&page.Items[i]); err != nil {
				return err
			}
		}
		if page.NextCursor == "" || len(page.Items) == 0 {
			return nil
		}
		cursor = page.NextCursor
	}
}

// ChangeSchedule changes members of the schedule's spec (PATCH /v1/schedules/{job}/{name})
// and returns the schedule: the members patch gives replace the schedule's, a nil one
// clears it, the rest are kept. An empty patch is refused before anything is sent. The
// schedule is planned afresh from the time of the call: it goes on with its next
// firing, and firings already created (at most a minute ahead) keep their values. A
// job's spec.cron entry matches ErrScheduleReadOnly; a member the spec does not have
// ErrMalformedJSON, a bad value ErrInvalidField, each naming it.
//
//	s, err := c.ChangeSchedule(ctx, "report-job", "customer-42",
//		asyncd.SchedulePatch{"every": 15 * time.Minute, "priority": 5, "jitter": nil})
func (c *Client) ChangeSchedule(ctx context.Context, job, name string, patch SchedulePatch) (*Schedule, error) {
	body, err := patch.wire()
	if err != nil {
		return nil, err
	}
	return c.scheduleCall(ctx, http.MethodPatch, schedulePath(job, name, ""), body)
}

// PauseSchedule pauses the schedule: it creates no firings (its NextFiring is nil) until
// ResumeSchedule. Firings already created stay. A job's spec.cron entry matches
// ErrScheduleReadOnly (pause it in the config: spec.cron[].paused).
func (c *Client) PauseSchedule(ctx context.Context, job, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodPost, schedulePath(job, name, "/pause"), nil)
}

// ResumeSchedule resumes a paused schedule: it goes on with its next firing; the
// firings of the pause are not caught up.
func (c *Client) ResumeSchedule(ctx context.Context, job, name string) (*Schedule, error) {
	return c.scheduleCall(ctx, http.MethodPost, schedulePath(job, name, "/resume"), nil)
}

// DeleteSchedule deletes the schedule (DELETE /v1/schedules/{job}/{name}); the firings
// it created stay. A job's spec.cron entry matches ErrScheduleReadOnly.
func (c *Client) DeleteSchedule(ctx context.Context, job, name string) error {
	return c.do(ctx, http.MethodDelete, schedulePath(job, name, ""), nil, nil)
}

// TriggerSchedule fires the schedule once, now, besides its firings
// (POST /v1/schedules/{job}/{name}/trigger), and returns the task it created, as
// TriggerCron does (CronTrigger.Entry is the schedule's name). A job's spec.cron entry
// can be triggered too.
func (c *Client) TriggerSchedule(ctx context.Context, job, name string) (*CronTrigger, error) {
	var res CronTrigger
	if err := c.do(ctx, http.MethodPost, schedulePath(job, name, "/trigger"), nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// BackfillSchedule creates the schedule's firings whose instants fall in [from, to), as
// if it had been running then (POST /v1/schedules/{job}/{name}/backfill): those whose
// instant has passed are due at once, the others at their instant. At most MaxBackfill
// per call (more, or a to not after from, matches ErrInvalidField with Field "to"). Each
// firing is created once however often the backfill is repeated: Created counts the new
// ones among Firings. Overlap does not apply; each firing is a task of its own. An Every
// schedule has no firing before its StartAt (or, without one, its creation). A job's
// spec.cron entry can be backfilled too.
func (c *Client) BackfillSchedule(ctx context.Context, job, name string, from, to time.Time) (*BackfillResult, error) {
	body := backfillBody{From: formatTime(from), To: formatTime(to)}
	var res BackfillResult
	if err := c.do(ctx, http.MethodPost, schedulePath(job, name, "/backfill"), body, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

type backfillBody struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (c *Client) scheduleCall(ctx context.Context, method, path string, in any) (*Schedule, error) {
	var s Schedule
	if err := c.do(ctx, method, path, in, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
