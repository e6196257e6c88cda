//! Schedules (`/v1/schedules`, docs/api.md "Schedules"): a job's tasks fired on a cron
//! or at a fixed interval, created, changed and deleted at runtime.

use asyncd_contract::{
    BackfillRequest, BackfillResult, CronTriggerResult, Schedule, ScheduleCreate, SchedulePage,
    ScheduleSpec,
};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::Value;

use super::{Client, escape};
use crate::error::Error;

/// `/v1/schedules/{job}/{name}` and what follows it.
fn schedule_path(job: &str, name: &str, rest: &str) -> String {
    format!("/v1/schedules/{}/{}{rest}", escape(job), escape(name))
}

impl Client {
    /// Creates the schedule `name` of job `job` (its AsyncJobConfig's name) with `spec`
    /// (`POST /v1/schedules`). A name the job already has a schedule of is refused with
    /// `schedule_exists` ([`ApiError::field`](crate::ApiError::field) `name`): use
    /// [`put_schedule`](Self::put_schedule) to write over it. A spec the server refuses
    /// is `invalid_field` naming the member (`cron`, `every`, `jitter`, …).
    ///
    /// Under a [`RetryPolicy`](crate::RetryPolicy), a create that was stored but whose
    /// answer was lost comes back `schedule_exists` from its retry;
    /// [`put_schedule`](Self::put_schedule) is safe to repeat.
    pub async fn create_schedule(
        &self,
        job: &str,
        name: &str,
        spec: &ScheduleSpec,
    ) -> Result<Schedule, Error> {
        let body = ScheduleCreate {
            job: job.to_string(),
            name: name.to_string(),
            spec: spec.clone(),
        };
        self.call(Method::POST, "/v1/schedules", Some(&body)).await
    }

    /// Creates the schedule `name` of job `job`, or writes `spec` over it
    /// (`PUT /v1/schedules/{job}/{name}`): an upsert, for a caller that keeps one
    /// schedule per customer without knowing which exist. Returns the schedule and
    /// whether it was created (`201`) rather than written over (`200`). A job's
    /// `spec.cron` entry is refused with `schedule_read_only`.
    pub async fn put_schedule(
        &self,
        job: &str,
        name: &str,
        spec: &ScheduleSpec,
    ) -> Result<(Schedule, bool), Error> {
        let (status, schedule) = self
            .call_status(Method::PUT, &schedule_path(job, name, ""), Some(spec))
            .await?;
        Ok((schedule, status == 201))
    }

    /// The schedule `name` of job `job` (`GET /v1/schedules/{job}/{name}`); `not_found`
    /// when the job has none of that name (its [`ApiError::field`](crate::ApiError::field)
    /// is `name`; `job` for a job no config declares).
    pub async fn get_schedule(&self, job: &str, name: &str) -> Result<Schedule, Error> {
        self.call(Method::GET, &schedule_path(job, name, ""), None::<&()>)
            .await
    }

    /// One page of job `job`'s schedules, by name, its `spec.cron` entries among them
    /// (`source: config`): at most `limit` (1 to
    /// [`MAX_SCHEDULE_PAGE`](asyncd_contract::MAX_SCHEDULE_PAGE); the server's default,
    /// 100, with `None`), after `cursor`, a previous page's `next_cursor`. The last page
    /// has no `next_cursor`.
    pub async fn list_schedules(
        &self,
        job: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<SchedulePage, Error> {
        let mut path = format!("/v1/schedules?job={}", escape(job));
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={}", escape(cursor)));
        }
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Changes members of the schedule's spec (`PATCH /v1/schedules/{job}/{name}`):
    /// `patch` is a JSON object (a [`SchedulePatch`](asyncd_contract::SchedulePatch) or
    /// a `json!({...})`) whose members replace the schedule's, a `null` clearing one;
    /// giving `cron` drops `every` and the reverse. The rest are kept. Anything but an
    /// object is refused by the server (`malformed_json`), as is a member the spec does
    /// not have.
    ///
    /// ```no_run
    /// # async fn run(client: asyncd_client::Client) -> Result<(), asyncd_client::Error> {
    /// let s = client
    ///     .change_schedule("report-job", "customer-42", serde_json::json!({"priority": 5, "jitter": null}))
    ///     .await?;
    /// assert_eq!(s.spec.priority, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn change_schedule(
        &self,
        job: &str,
        name: &str,
        patch: impl Into<Value>,
    ) -> Result<Schedule, Error> {
        let patch: Value = patch.into();
        self.call(Method::PATCH, &schedule_path(job, name, ""), Some(&patch))
            .await
    }

    /// Pauses the schedule: it creates no firings (its `next_firing` is `None`) until
    /// [`resume_schedule`](Self::resume_schedule). Firings already created stay.
    pub async fn pause_schedule(&self, job: &str, name: &str) -> Result<Schedule, Error> {
        self.call(
            Method::POST,
            &schedule_path(job, name, "/pause"),
            None::<&()>,
        )
        .await
    }

    /// Resumes a paused schedule: it goes on with its next firing; the firings of the
    /// pause are not caught up.
    pub async fn resume_schedule(&self, job: &str, name: &str) -> Result<Schedule, Error> {
        self.call(
            Method::POST,
            &schedule_path(job, name, "/resume"),
            None::<&()>,
        )
        .await
    }

    /// Deletes the schedule (`DELETE /v1/schedules/{job}/{name}`, `204`); the firings it
    /// created stay. A job's `spec.cron` entry is refused with `schedule_read_only`.
    pub async fn delete_schedule(&self, job: &str, name: &str) -> Result<(), Error> {
        self.call_no_content(Method::DELETE, &schedule_path(job, name, ""))
            .await
    }

    /// Fires the schedule once, now, besides its firings
    /// (`POST /v1/schedules/{job}/{name}/trigger`); returns the task it created, as
    /// [`trigger_cron`](Self::trigger_cron) does. A job's `spec.cron` entry can be
    /// triggered too.
    pub async fn trigger_schedule(
        &self,
        job: &str,
        name: &str,
    ) -> Result<CronTriggerResult, Error> {
        self.call(
            Method::POST,
            &schedule_path(job, name, "/trigger"),
            None::<&()>,
        )
        .await
    }

    /// Creates the schedule's firings whose instants fall in `[from, to)`, as if it had
    /// been running then (`POST /v1/schedules/{job}/{name}/backfill`): at most
    /// [`MAX_BACKFILL`](asyncd_contract::MAX_BACKFILL) per call (more is `invalid_field`
    /// naming `to`, as is a `to` not after `from`). Each firing is created once however
    /// often the backfill is repeated: `created` counts the new ones among `firings`.
    /// Overlap does not apply; each firing is a task of its own.
    pub async fn backfill_schedule(
        &self,
        job: &str,
        name: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<BackfillResult, Error> {
        self.call(
            Method::POST,
            &schedule_path(job, name, "/backfill"),
            Some(&BackfillRequest { from, to }),
        )
        .await
    }
}
