// Package asyncd is the Go client for the asyncd task queue and the helper for
// services that execute its tasks.
//
// A Client submits, inspects, cancels and redrives tasks over the HTTP API
// (docs/api.md), and creates, changes and fires schedules (CreateSchedule, PutSchedule,
// ChangeSchedule, …; docs/api.md, "Schedules"). The same Client is an http.Handler: register executors with
// RegisterExecutor and mount it at the URL an AsyncJobConfig's spec.executor.url
// names. It verifies asyncd's HMAC signature, hands the task to the handler and
// maps the handler's outcome onto the executor contract:
//
//	nil             -> 200, the task succeeded
//	Retry(after)    -> 503 with Retry-After, retried then
//	Permanent(err)  -> 422, straight to dead letters
//	any other error -> 500, retried with exponential backoff
//
// A batch call (Asyncd-Batch, a job with spec.executor.batch) runs the same handlers,
// once per task and concurrently, and answers 200 with each task's outcome mapped the
// same way ("success", "accepted", "retry" or "failed").
//
// The package uses the standard library only.
package asyncd
