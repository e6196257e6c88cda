package asyncd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// IdempotencyKeyFrom derives an idempotency key from the task type and the named
// top-level fields of payload (the whole payload when no field is named), so that
// resubmitting the same logical task — after a timeout, a crash, a redelivered
// message — yields the same key and asyncd keeps only the first task.
//
// The key is the hex SHA-256 of the canonical JSON of [taskType, selection], where
// selection is {field: value, …} for the named fields. Canonical JSON: objects with
// keys sorted by code point, no whitespace, integral numbers as plain integers (42.0
// is 42), other numbers as the shortest round-trip float64 in exponent form (1.5e-07),
// strings escaped only where JSON requires it (\" \\ \b \f \n \r \t, other controls as
// \u00xx). The Python SDK's idempotency_key_from computes the same keys.
func IdempotencyKeyFrom(taskType string, payload any, fields ...string) (string, error) {
	if taskType == "" {
		return "", errors.New("asyncd: idempotency key needs a task type")
	}
	raw, err := marshalPayload(payload)
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("asyncd: decode payload: %w", err)
	}
	sel := v
	if len(fields) > 0 {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", errors.New("asyncd: idempotency key fields named, but the payload is not a JSON object")
		}
		m := make(map[string]any, len(fields))
		for _, f := range fields {
			fv, ok := obj[f]
			if !ok {
				return "", fmt.Errorf("asyncd: idempotency key field %q is not in the payload", f)
			}
			m[f] = fv
		}
		sel = m
	}
	var b strings.Builder
	if err := writeCanonical(&b, []any{taskType, sel}); err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:]), nil
}

// CanonicalJSON returns the canonical JSON text IdempotencyKeyFrom hashes.
func CanonicalJSON(v any) (string, error) {
	raw, err := marshalPayload(v)
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return "", err
	}
	var b strings.Builder
	err = writeCanonical(&b, x)
	return b.String(), err
}

func writeCanonical(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		writeCanonicalString(b, x)
	case json.Number:
		s, err := canonicalNumber(string(x))
		if err != nil {
			return err
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // byte order of UTF-8 is code point order
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonicalString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("asyncd: canonical JSON: unexpected %T", v)
	}
	return nil
}

func canonicalNumber(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		n, ok := new(big.Int).SetString(lit, 10)
		if !ok {
			return "", fmt.Errorf("asyncd: bad number %q", lit)
		}
		return n.String(), nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return "", fmt.Errorf("asyncd: number %q: %w", lit, err)
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "", fmt.Errorf("asyncd: number %q out of range", lit)
	}
	if f == math.Trunc(f) {
		n, _ := big.NewFloat(f).Int(nil)
		return n.String(), nil
	}
	return strconv.FormatFloat(f, 'e', -1, 64), nil
}

func writeCanonicalString(b *strings.Builder, s string) {
	const hexdigits = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexdigits[r>>4])
				b.WriteByte(hexdigits[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
