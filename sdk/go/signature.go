package asyncd

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Executor call headers (docs/api.md, "Executor contract").
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderTaskID         = "Asyncd-Task-Id"
	HeaderAttempt        = "Asyncd-Attempt"
	HeaderLeaseToken     = "Asyncd-Lease-Token"
	HeaderCallbackURL    = "Asyncd-Callback-Url"
	HeaderTimestamp      = "Asyncd-Timestamp"
	HeaderSignature      = "Asyncd-Signature"
	// HeaderBatch marks a batch call (docs/api.md, "Batch delivery"): its value is the
	// number of tasks in the body, which carries each task's id, attempt, idempotency
	// key and lease token instead of the four per-task headers above.
	HeaderBatch = "Asyncd-Batch"
)

// SignatureTolerance is how far Asyncd-Timestamp may be from the executor's clock:
// beyond it a call is refused as stale, and within it the same (task, attempt) is
// refused as a replay.
const SignatureTolerance = 5 * time.Minute

// MaxReplayEntries bounds the (task, attempt) pairs a Verifier remembers. An entry is
// kept only until its call's timestamp leaves the window (after that the call is
// refused as stale anyway), so the bound is reached only past about 160 verified calls
// per second sustained over a window; each entry is about 100 bytes, so the cache stays
// near 10 MiB. Past the bound the oldest entries are forgotten first: memory must not
// grow with what callers send.
const MaxReplayEntries = 100_000

// Errors VerifySignature and Verifier.Verify return; each matches ErrBadSignature.
var (
	ErrBadSignature       = errors.New("asyncd: bad signature")
	ErrMalformedTimestamp = fmt.Errorf("%w: missing or malformed %s", ErrBadSignature, HeaderTimestamp)
	ErrStaleTimestamp     = fmt.Errorf("%w: timestamp more than 5 minutes off", ErrBadSignature)
	ErrReplayed           = fmt.Errorf("%w: this task attempt was already delivered", ErrBadSignature)
	ErrNoSigningKey       = fmt.Errorf("%w: no signing key configured", ErrBadSignature)
)

// ErrBatchCall is Verifier.Verify's answer to a batch call: its replay check is per
// task of the body, which Verifier.VerifyBatch does.
var ErrBatchCall = errors.New("asyncd: a batch call (" + HeaderBatch + "): verify it with Verifier.VerifyBatch")

// ErrMalformedBatch is Verifier.VerifyBatch's answer to a signed batch call whose body
// is not a batch of asyncd tasks.
var ErrMalformedBatch = errors.New("asyncd: body is not an asyncd batch")

// CanonicalString returns the bytes Asyncd-Signature covers: the values of
// Asyncd-Timestamp, Asyncd-Task-Id, Asyncd-Attempt, Idempotency-Key,
// Asyncd-Lease-Token and Asyncd-Callback-Url, exactly as sent, each followed by a
// line feed, then the body (docs/security.md). For a batch call (Asyncd-Batch) the
// four per-task values are empty, whatever headers came with it:
// "<timestamp>\n\n\n\n\n<callback url>\n<body>" — the signed body holds every task's id,
// attempt and lease token.
func CanonicalString(h http.Header, body []byte) []byte {
	batch := h.Get(HeaderBatch) != ""
	var b []byte
	for _, name := range []string{HeaderTimestamp, HeaderTaskID, HeaderAttempt, HeaderIdempotencyKey, HeaderLeaseToken, HeaderCallbackURL} {
		if !batch || name == HeaderTimestamp || name == HeaderCallbackURL {
			b = append(b, h.Get(name)...)
		}
		b = append(b, '\n')
	}
	return append(b, body...)
}

func mac(key, canonical []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(canonical)
	return m.Sum(nil)
}

// Sign returns the Asyncd-Signature value asyncd sends for a call with these headers
// and body: "v2=<hex HMAC-SHA256(key, CanonicalString)>" per key, comma-separated.
// Useful in tests of an executor.
func Sign(keys [][]byte, h http.Header, body []byte) string {
	canonical := CanonicalString(h, body)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, "v2="+hex.EncodeToString(mac(k, canonical)))
	}
	return strings.Join(parts, ",")
}

// VerifySignature checks a call's Asyncd-Timestamp (within SignatureTolerance of now)
// and Asyncd-Signature against keys: one of its comma-separated "v2=" values must match
// one of the keys (two while a key is rotated; empty keys are ignored). It does not
// refuse replays: a Verifier does.
func VerifySignature(keys [][]byte, h http.Header, body []byte, now time.Time) error {
	_, err := verify(keys, h, body, now)
	return err
}

func verify(keys [][]byte, h http.Header, body []byte, now time.Time) (int64, error) {
	usable := 0
	for _, k := range keys {
		if len(k) > 0 {
			usable++
		}
	}
	if usable == 0 {
		return 0, ErrNoSigningKey
	}
	ts, err := strconv.ParseInt(strings.TrimSpace(h.Get(HeaderTimestamp)), 10, 64)
	if err != nil {
		return 0, ErrMalformedTimestamp
	}
	skew := now.Sub(time.Unix(ts, 0))
	if skew > SignatureTolerance || skew < -SignatureTolerance {
		return 0, ErrStaleTimestamp
	}
	canonical := CanonicalString(h, body)
	for _, part := range strings.Split(h.Get(HeaderSignature), ",") {
		sig, ok := strings.CutPrefix(strings.TrimSpace(part), "v2=")
		if !ok {
			continue
		}
		got, err := hex.DecodeString(sig)
		if err != nil {
			continue
		}
		for _, k := range keys {
			if len(k) > 0 && hmac.Equal(got, mac(k, canonical)) {
				return ts, nil
			}
		}
	}
	return 0, ErrBadSignature
}

// Verifier checks signatures with VerifySignature and also refuses a second call for
// the same (task, attempt) within the window: a captured call replayed, even signed
// anew, never runs twice in this process. The lease token is part of the identity: a
// redriven task starts again at attempt 1, with a new token, and is not a replay. Safe
// for concurrent use.
type Verifier struct {
	keys [][]byte
	max  int

	mu    sync.Mutex
	seen  map[string]int64 // "<task id>\n<attempt>\n<lease token>" → unix second it may be forgotten
	order []seenEntry      // insertion order, oldest first
}

type seenEntry struct {
	key   string
	until int64
}

// NewVerifier returns a Verifier accepting calls signed with any of keys.
func NewVerifier(keys ...[]byte) *Verifier {
	return &Verifier{keys: keys, max: MaxReplayEntries, seen: map[string]int64{}}
}

// Verify checks a single call and records its (task, attempt). Only a verified call is
// recorded, so forged calls cannot fill the cache or block a real one. A batch call
// (Asyncd-Batch) gets ErrBatchCall: check it with VerifyBatch.
func (v *Verifier) Verify(h http.Header, body []byte, now time.Time) error {
	if h.Get(HeaderBatch) != "" {
		return ErrBatchCall
	}
	ts, err := verify(v.keys, h, body, now)
	if err != nil {
		return err
	}
	return v.admit(h.Get(HeaderTaskID), h.Get(HeaderAttempt), h.Get(HeaderLeaseToken), ts, now)
}

// VerifyBatch checks a batch call (Asyncd-Batch): its signature and timestamp as
// VerifySignature does, then each task of its body against the replay cache as Verify
// does a single call's headers. err refuses the whole call (ErrBadSignature and the
// errors matching it; ErrMalformedBatch when the signed body is not a batch) and
// records nothing; otherwise replayed[i] is ErrReplayed when the body's i-th (task,
// attempt, lease token) was accepted before, in a single call or a batch, and nil when
// it is accepted now. Run no handler for a replayed task.
func (v *Verifier) VerifyBatch(h http.Header, body []byte, now time.Time) (replayed []error, err error) {
	ts, err := v.verifyBatchCall(h, body, now)
	if err != nil {
		return nil, err
	}
	call, err := decodeBatch(body)
	if err != nil {
		return nil, err
	}
	return v.admitBatch(call.Tasks, ts, now), nil
}

// verifyBatchCall checks a batch call's signature and timestamp, returning the latter.
func (v *Verifier) verifyBatchCall(h http.Header, body []byte, now time.Time) (int64, error) {
	if h.Get(HeaderBatch) == "" {
		return 0, fmt.Errorf("%w: not a batch call (no %s)", ErrBadSignature, HeaderBatch)
	}
	return verify(v.keys, h, body, now)
}

// admitBatch records each task of a verified batch call, or says it is a replay.
func (v *Verifier) admitBatch(tasks []taskCall, ts int64, now time.Time) []error {
	replayed := make([]error, len(tasks))
	for i, t := range tasks {
		replayed[i] = v.admit(t.ID, strconv.Itoa(t.Attempt), t.LeaseToken, ts, now)
	}
	return replayed
}

// admit records the (task, attempt, lease token) of a verified call whose timestamp is
// ts, or refuses it as a replay.
func (v *Verifier) admit(taskID, attempt, leaseToken string, ts int64, now time.Time) error {
	key := taskID + "\n" + attempt + "\n" + leaseToken
	v.mu.Lock()
	defer v.mu.Unlock()
	nowUnix := now.Unix()
	v.prune(nowUnix)
	if until, ok := v.seen[key]; ok && until >= nowUnix {
		return ErrReplayed
	}
	for len(v.order) >= v.max {
		v.forget(v.order[0])
		v.order = v.order[1:]
	}
	until := ts + int64(SignatureTolerance/time.Second)
	v.seen[key] = until
	v.order = append(v.order, seenEntry{key, until})
	return nil
}

// forget drops e unless its key was recorded again since.
func (v *Verifier) forget(e seenEntry) {
	if v.seen[e.key] == e.until {
		delete(v.seen, e.key)
	}
}

// prune forgets entries from the front that have left the window.
func (v *Verifier) prune(nowUnix int64) {
	n := 0
	for n < len(v.order) && v.order[n].until < nowUnix {
		v.forget(v.order[n])
		n++
	}
	v.order = v.order[n:]
}
