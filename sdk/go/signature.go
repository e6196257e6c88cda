package asyncd

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
)

// SignatureTolerance is how far Asyncd-Timestamp may be from the executor's clock;
// beyond it a captured call cannot be replayed.
const SignatureTolerance = 5 * time.Minute

// ErrBadSignature is returned by VerifySignature for any call that must be refused.
var ErrBadSignature = errors.New("asyncd: bad signature")

// Sign returns the Asyncd-Signature value for body sent at unix time timestamp:
// "v1=" + hex HMAC-SHA256(secret, "<timestamp>.<body>").
func Sign(secret []byte, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

// VerifySignature checks an executor call's Asyncd-Timestamp and Asyncd-Signature
// headers against body. The signature header may list several comma-separated
// "v1=" values (a secret being rotated); one match is enough.
func VerifySignature(secret []byte, timestamp, signature string, body []byte, now time.Time) error {
	ts, err := strconv.ParseInt(strings.TrimSpace(timestamp), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: missing or malformed %s", ErrBadSignature, HeaderTimestamp)
	}
	skew := now.Sub(time.Unix(ts, 0))
	if skew > SignatureTolerance || skew < -SignatureTolerance {
		return fmt.Errorf("%w: timestamp more than 5 minutes off", ErrBadSignature)
	}
	want := Sign(secret, ts, body)
	for _, part := range strings.FieldsFunc(signature, func(r rune) bool { return r == ',' || r == ' ' }) {
		if hmac.Equal([]byte(part), []byte(want)) {
			return nil
		}
	}
	return ErrBadSignature
}
