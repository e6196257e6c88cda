package asyncd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// JobConfig is the part of an AsyncJobConfig a service team usually writes. YAML
// renders the document `asyncd dev --config DIR` reads and `kubectl apply` takes.
type JobConfig struct {
	Name     string // metadata.name
	TaskType string
	// ExecutorURL is where asyncd POSTs the tasks: a Client mounted as http.Handler.
	ExecutorURL string
	Timeout     time.Duration // per attempt; 0 keeps the server default
	// ErrorBodies is spec.executor.errorBodies: a task's last_error keeps what the
	// executor answered with an error (its body), not only asyncd's status line. Off by
	// default, so a job's config cannot read the answers of services it does not own.
	ErrorBodies bool
	// SigningSecret names the Secret, in the job's namespace, whose keys sign every
	// call (spec.executor.signing.secretRef.name); SigningKeys are its keys, the
	// primary first (default ["key"]; two while rotating).
	SigningSecret string
	SigningKeys   []string
	// Batch, when set, has asyncd send up to MaxTasks due tasks in one call
	// (spec.executor.batch; docs/api.md, "Batch delivery"). The Client's executor
	// handlers take batch calls as they are.
	Batch          *BatchDelivery
	MaxRetries     *int
	Backoff        string // "exponential" or "fixed"; empty keeps the default
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// UniqueKey is a template over payload fields, e.g. "order:{order_id}".
	UniqueKey   string
	Concurrency int
	Cron        []CronSchedule
}

// BatchDelivery is spec.executor.batch.
type BatchDelivery struct {
	MaxTasks int // tasks per call, 1–1000
	// MaxWait is how long a due task may be held to fill a call (0–10s; 0, the default,
	// sends what is due at once).
	MaxWait time.Duration
}

// CronSchedule is one entry of spec.cron.
type CronSchedule struct {
	Name     string
	Schedule string // checked with ValidateCron
	Payload  any
}

// kv keeps keys in the order a person reading the YAML expects.
type kv struct {
	k string
	v any
}
type ordered []kv

// YAML renders the AsyncJobConfig document, refusing cron schedules without CRON_TZ.
func (j JobConfig) YAML() (string, error) {
	if j.Name == "" || j.TaskType == "" || j.ExecutorURL == "" {
		return "", errors.New("asyncd: job config needs Name, TaskType and ExecutorURL")
	}
	exec := ordered{{"url", j.ExecutorURL}}
	if j.Timeout > 0 {
		exec = append(exec, kv{"timeout", formatDuration(j.Timeout)})
	}
	if j.ErrorBodies {
		exec = append(exec, kv{"errorBodies", true})
	}
	if j.SigningSecret != "" {
		ref := ordered{{"name", j.SigningSecret}}
		if len(j.SigningKeys) > 0 {
			keys := make([]any, len(j.SigningKeys))
			for i, k := range j.SigningKeys {
				keys[i] = k
			}
			ref = append(ref, kv{"keys", keys})
		}
		exec = append(exec, kv{"signing", ordered{{"secretRef", ref}}})
	}
	if j.Batch != nil {
		batch := ordered{{"maxTasks", j.Batch.MaxTasks}}
		if j.Batch.MaxWait > 0 {
			batch = append(batch, kv{"maxWait", formatDuration(j.Batch.MaxWait)})
		}
		exec = append(exec, kv{"batch", batch})
	}
	spec := ordered{{"taskType", j.TaskType}, {"executor", exec}}
	var retry ordered
	if j.MaxRetries != nil {
		retry = append(retry, kv{"maxRetries", *j.MaxRetries})
	}
	if j.Backoff != "" {
		retry = append(retry, kv{"backoff", j.Backoff})
	}
	if j.InitialBackoff > 0 {
		retry = append(retry, kv{"initialBackoff", formatDuration(j.InitialBackoff)})
	}
	if j.MaxBackoff > 0 {
		retry = append(retry, kv{"maxBackoff", formatDuration(j.MaxBackoff)})
	}
	if len(retry) > 0 {
		spec = append(spec, kv{"retry", retry})
	}
	if j.UniqueKey != "" {
		spec = append(spec, kv{"uniqueKey", j.UniqueKey})
	}
	if j.Concurrency > 0 {
		spec = append(spec, kv{"concurrency", j.Concurrency})
	}
	if len(j.Cron) > 0 {
		var crons []any
		for _, c := range j.Cron {
			if err := ValidateCron(c.Schedule); err != nil {
				return "", err
			}
			entry := ordered{{"name", c.Name}, {"schedule", c.Schedule}}
			if c.Payload != nil {
				raw, err := marshalPayload(c.Payload)
				if err != nil {
					return "", err
				}
				var p any
				dec := json.NewDecoder(bytes.NewReader(raw))
				dec.UseNumber()
				if err := dec.Decode(&p); err != nil {
					return "", err
				}
				entry = append(entry, kv{"payload", p})
			}
			crons = append(crons, entry)
		}
		spec = append(spec, kv{"cron", crons})
	}
	doc := ordered{
		{"apiVersion", "asyncd.example.io/v1"},
		{"kind", "AsyncJobConfig"},
		{"metadata", ordered{{"name", j.Name}}},
		{"spec", spec},
	}
	var b strings.Builder
	if err := writeYAML(&b, doc, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// writeYAML writes block-style YAML whose scalars are JSON literals: JSON's quoted
// strings are valid YAML double-quoted scalars, so no YAML quoting rules are needed.
func writeYAML(b *strings.Builder, v any, indent int) error {
	pad := strings.Repeat("  ", indent)
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		o := make(ordered, 0, len(keys))
		for _, k := range keys {
			o = append(o, kv{k, x[k]})
		}
		return writeYAML(b, o, indent)
	case ordered:
		for _, e := range x {
			key, _ := json.Marshal(e.k)
			b.WriteString(pad)
			if isIdent(e.k) {
				b.WriteString(e.k)
			} else {
				b.Write(key)
			}
			b.WriteByte(':')
			if err := writeYAMLValue(b, e.v, indent); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if isNonEmptyMap(e) {
				// "- key: v" with the entry's other keys aligned under the first.
				var tmp strings.Builder
				if err := writeYAML(&tmp, e, indent+1); err != nil {
					return err
				}
				b.WriteString(pad + "- ")
				b.WriteString(strings.TrimPrefix(tmp.String(), pad+"  "))
				continue
			}
			b.WriteString(pad)
			b.WriteString("-")
			if err := writeYAMLValue(b, e, indent); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("asyncd: yaml: unexpected %T", v)
	}
	return nil
}

// writeYAMLValue writes what follows "key:" or "-".
func writeYAMLValue(b *strings.Builder, v any, indent int) error {
	switch x := v.(type) {
	case ordered:
		if len(x) == 0 {
			b.WriteString(" {}\n")
			return nil
		}
	case map[string]any:
		if len(x) == 0 {
			b.WriteString(" {}\n")
			return nil
		}
	case []any:
		if len(x) == 0 {
			b.WriteString(" []\n")
			return nil
		}
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.WriteByte(' ')
		b.Write(raw)
		b.WriteByte('\n')
		return nil
	}
	b.WriteByte('\n')
	return writeYAML(b, v, indent+1)
}

func isNonEmptyMap(v any) bool {
	switch x := v.(type) {
	case ordered:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return false
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	// Keys YAML 1.1 would read as booleans or null must be quoted.
	switch strings.ToLower(s) {
	case "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~":
		return false
	}
	return true
}
