package asyncd_test

import (
	"strings"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// The same table is in sdk/python/tests/test_cron.py.
var cronValid = []string{
	"CRON_TZ=Asia/Singapore 0 0 * * *",
	"CRON_TZ=America/New_York */15 9-17 * * MON-FRI",
	"CRON_TZ=Europe/Berlin 30 2 L * ?",
	"CRON_TZ=UTC 0 0 1,15 jan,jul *",
	"CRON_TZ=Australia/Lord_Howe 0 30 2 * * 0",
	"CRON_TZ=Europe/London 0 9 15W * *",
	"CRON_TZ=Europe/London 0 9 ? * 5L",
	"CRON_TZ=Europe/London 0 9 ? * MON#2",
	"CRON_TZ=America/Argentina/Buenos_Aires @daily",
	"  CRON_TZ=Asia/Tokyo 0 0 * * 7  ",
}

var cronInvalid = map[string]string{
	"0 0 * * *":                            "CRON_TZ",
	"TZ=Asia/Singapore 0 0 * * *":          "CRON_TZ",
	"CRON_TZ= 0 0 * * *":                   "time zone",
	"CRON_TZ=Local 0 0 * * *":              "time zone",
	"CRON_TZ=Mars/Olympus 0 0 * * *":       "unknown time zone",
	"CRON_TZ=Asia/Singapore":               "no schedule",
	"CRON_TZ=Asia/Singapore 0 0 * *":       "5 fields",
	"CRON_TZ=Asia/Singapore 0 0 * * * * *": "5 fields",
	"CRON_TZ=Asia/Singapore 60 0 * * *":    "minute",
	"CRON_TZ=Asia/Singapore 0 24 * * *":    "hour",
	"CRON_TZ=Asia/Singapore 0 0 0 * *":     "day-of-month",
	"CRON_TZ=Asia/Singapore 0 0 * 13 *":    "month",
	"CRON_TZ=Asia/Singapore 0 0 * * 8":     "day-of-week",
	"CRON_TZ=Asia/Singapore 0 0 * * FUN":   "day-of-week",
	"CRON_TZ=Asia/Singapore */0 0 * * *":   "step",
	"CRON_TZ=Asia/Singapore 0 17-9 * * *":  "backwards",
	"CRON_TZ=Asia/Singapore 0 0 1-x * *":   "day-of-month",
	"CRON_TZ=Asia/Singapore ? 0 * * *":     "minute",
	"CRON_TZ=Asia/Singapore 0 0 * * MON#6": "nth",
	"CRON_TZ=Asia/Singapore 0 0 1,,2 * *":  "empty",
	"CRON_TZ=Asia/Singapore @fortnightly":  "macro",
	"CRON_TZ=Asia/Singapore 61 0 0 * * *":  "second",
}

func TestValidateCron(t *testing.T) {
	for _, expr := range cronValid {
		if err := asyncd.ValidateCron(expr); err != nil {
			t.Errorf("ValidateCron(%q) = %v", expr, err)
		}
	}
	for expr, want := range cronInvalid {
		err := asyncd.ValidateCron(expr)
		if err == nil {
			t.Errorf("ValidateCron(%q) accepted", expr)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateCron(%q) = %q, want it to mention %q", expr, err, want)
		}
	}
}

func TestJobConfigYAML(t *testing.T) {
	j := asyncd.JobConfig{
		Name: "order-cancel-job", TaskType: "cancel_expired_order",
		ExecutorURL: "http://order-service:8080/tasks/cancel", Timeout: 30 * time.Second,
		SigningSecret: "order-cancel-signing", SigningKeys: []string{"key", "previous"}, MaxRetries: asyncd.Retries(3),
		Batch:   &asyncd.BatchDelivery{MaxTasks: 100, MaxWait: 20 * time.Millisecond},
		Backoff: "exponential", InitialBackoff: time.Second, MaxBackoff: 10 * time.Minute,
		UniqueKey: "order:{order_id}", Concurrency: 64,
		Cron: []asyncd.CronSchedule{{Name: "nightly-sweep", Schedule: "CRON_TZ=Asia/Singapore 0 0 * * *",
			Payload: map[string]any{"sweep": true, "on": []any{}, "nested": map[string]any{"a b": 1}}}},
	}
	got, err := j.YAML()
	if err != nil {
		t.Fatal(err)
	}
	want := `apiVersion: "asyncd.example.io/v1"
kind: "AsyncJobConfig"
metadata:
  name: "order-cancel-job"
spec:
  taskType: "cancel_expired_order"
  executor:
    url: "http://order-service:8080/tasks/cancel"
    timeout: "30s"
    signing:
      secretRef:
        name: "order-cancel-signing"
        keys:
          - "key"
          - "previous"
    batch:
      maxTasks: 100
      maxWait: "20ms"
  retry:
    maxRetries: 3
    backoff: "exponential"
    initialBackoff: "1s"
    maxBackoff: "10m"
  uniqueKey: "order:{order_id}"
  concurrency: 64
  cron:
    - name: "nightly-sweep"
      schedule: "CRON_TZ=Asia/Singapore 0 0 * * *"
      payload:
        nested:
          "a b": 1
        "on": []
        sweep: true
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	j.Cron[0].Schedule = "0 0 * * *"
	if _, err := j.YAML(); err == nil || !strings.Contains(err.Error(), "CRON_TZ") {
		t.Fatalf("cron without CRON_TZ rendered: %v", err)
	}
}
