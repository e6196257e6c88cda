package asyncd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

func ExampleClient_Submit() {
	c := asyncd.NewClient(asyncd.WithEndpoint("http://127.0.0.1:7700"), asyncd.WithServiceName("orders"))
	payload := map[string]any{"order_id": 42}
	key, _ := asyncd.IdempotencyKeyFrom("cancel_expired_order", payload, "order_id")
	res, err := c.SubmitDelayed(context.Background(), &asyncd.Task{
		Type:           "cancel_expired_order",
		Payload:        payload,
		IdempotencyKey: key,
		MaxRetries:     asyncd.Retries(5),
	}, 15*time.Minute)
	var apiErr *asyncd.APIError
	switch {
	case errors.Is(err, asyncd.ErrUniqueConflict):
		errors.As(err, &apiErr)
		log.Printf("order 42 already has a pending cancellation: %s", apiErr.ExistingID)
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("task %s due at %s (duplicate: %v)", res.ID, res.ETA, res.Duplicate)
	}
}

func ExampleClient_RegisterExecutor() {
	c := asyncd.NewClient(asyncd.WithSigningSecret("from ORDER_CANCEL_SIGNING_SECRET"))
	c.RegisterExecutor("cancel_expired_order", func(ctx context.Context, payload string) error {
		info, _ := asyncd.TaskInfoFrom(ctx)
		var p struct {
			OrderID int `json:"order_id"`
		}
		if err := json.Unmarshal([]byte(payload), &p); err != nil {
			return asyncd.Permanent(err) // retrying cannot fix a bad payload
		}
		log.Printf("cancelling order %d (task %s, attempt %d)", p.OrderID, info.ID, info.Attempt)
		return nil
	})
	log.Fatal(http.ListenAndServe(":8080", c))
}

func ExampleIdempotencyKeyFrom() {
	key, _ := asyncd.IdempotencyKeyFrom("cancel_expired_order", map[string]any{"order_id": 42, "at": "now"}, "order_id")
	fmt.Println(key)
	// Output: 4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec
}

func ExampleValidateCron() {
	fmt.Println(asyncd.ValidateCron("CRON_TZ=Asia/Singapore 0 0 * * *"))
	fmt.Println(asyncd.ValidateCron("0 0 * * *") != nil)
	// Output:
	// <nil>
	// true
}

func ExampleClient_PutSchedule() {
	c := asyncd.NewClient(asyncd.WithEndpoint("http://127.0.0.1:7700"))
	ctx := context.Background()
	// One schedule per customer, written whether or not it exists.
	s, created, err := c.PutSchedule(ctx, "report-job", "customer-42", asyncd.ScheduleSpec{
		Cron:    "CRON_TZ=Europe/Berlin 0 9 * * MON",
		Payload: map[string]any{"customer": 42, "week_of": "{{scheduled_at}}"},
		Overlap: asyncd.OverlapBufferOne,
		Jitter:  5 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("schedule %s (created: %v), next firing %v", s.Name, created, s.NextFiring)
	// Twice a week from now on, and without jitter.
	if _, err := c.ChangeSchedule(ctx, "report-job", "customer-42", asyncd.SchedulePatch{
		"cron": "CRON_TZ=Europe/Berlin 0 9 * * MON,THU", "jitter": nil,
	}); errors.Is(err, asyncd.ErrScheduleReadOnly) {
		log.Print("customer-42 is a spec.cron entry of report-job: change its AsyncJobConfig")
	} else if err != nil {
		log.Fatal(err)
	}
}
