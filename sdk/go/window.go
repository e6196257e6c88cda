package asyncd

import "time"

// Debounce combines a task with the job's other submits of the same Key (Task.Debounce;
// docs/api.md, "Debounce and throttle").
//
// Trailing (the default): the job keeps one waiting task per key. Each submit replaces
// its payload and moves it to Period after that submit, never later than MaxDelay after
// the burst's first submit. The first submit is stored as usual; a later one is folded
// into the waiting task: its SubmitResult has Debounced set, ID the waiting task's and
// ETA its new due time. A trailing debounce sets the due time itself, so the task takes
// no Delay or ETA (ErrInvalidField naming "delay" or "eta").
//
// Leading: a submit after Period without one of its key is stored and runs as
// submitted; one within Period of the key's last submit stores nothing and is answered
// with Dropped set, ID the task the key last stored, ETA when the quiet period ends (each
// dropped submit extends it).
type Debounce struct {
	// Key names the burst within the job: 1 to 255 bytes.
	Key string
	// Period (1ms to 400 days): trailing, how long after the latest submit the task is
	// due; leading, the quiet after which a submit runs again.
	Period time.Duration
	// MaxDelay (trailing only; at least Period) caps the wait: the task is due at most
	// MaxDelay after the burst's first submit, however the submits keep coming. 0: no
	// cap.
	MaxDelay time.Duration
	// Mode is DebounceTrailing (also the zero value) or DebounceLeading.
	Mode DebounceMode
}

// DebounceMode says how a Debounce combines its key's submits.
type DebounceMode string

const (
	// DebounceTrailing: one waiting task per key, carrying the latest payload, due
	// Period after the latest submit.
	DebounceTrailing DebounceMode = "trailing"
	// DebounceLeading: the first submit after a quiet Period runs; the others are
	// dropped.
	DebounceLeading DebounceMode = "leading"
)

// Throttle stores at most one task of the job's Key per Period, counted from the
// submit that stored it (Task.Throttle). A submit within that period stores nothing:
// with OnLimitRefuse (the default) it is an error matching ErrThrottled whose
// ExistingID names the key's task; with OnLimitDrop it succeeds with Dropped set, ID the
// key's task and ETA when the window closes.
type Throttle struct {
	// Key names what is throttled within the job: 1 to 255 bytes.
	Key string
	// Period is 1ms to 400 days.
	Period time.Duration
	// OnLimit is OnLimitRefuse (also the zero value) or OnLimitDrop.
	OnLimit OnLimit
}

// OnLimit says what a submit over its Throttle gets.
type OnLimit string

const (
	// OnLimitRefuse: an error matching ErrThrottled (409).
	OnLimitRefuse OnLimit = "refuse"
	// OnLimitDrop: a SubmitResult with Dropped set; nothing is stored.
	OnLimitDrop OnLimit = "drop"
)

// debounceBody and throttleBody are the submit body's "debounce" and "throttle".
type debounceBody struct {
	Key      string `json:"key"`
	Period   string `json:"period"`
	MaxDelay string `json:"max_delay,omitempty"`
	Mode     string `json:"mode,omitempty"`
}

type throttleBody struct {
	Key     string `json:"key"`
	Period  string `json:"period"`
	OnLimit string `json:"on_limit,omitempty"`
}

// The values are the server's to judge (it names the field at fault); only what the
// SDK can tell for certain is refused before sending, in Client.body.
func (d *Debounce) body() *debounceBody {
	b := &debounceBody{Key: d.Key, Period: formatDuration(d.Period), Mode: string(d.Mode)}
	if d.MaxDelay != 0 {
		b.MaxDelay = formatDuration(d.MaxDelay)
	}
	return b
}

func (t *Throttle) body() *throttleBody {
	return &throttleBody{Key: t.Key, Period: formatDuration(t.Period), OnLimit: string(t.OnLimit)}
}
