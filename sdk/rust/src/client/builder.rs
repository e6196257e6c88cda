//! How a [`Client`] is configured and made.

use super::*;

/// Configures a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoint: String,
    service_name: Option<String>,
    http: Option<reqwest::Client>,
    timeout: Duration,
    token: TokenSource,
    retry: Option<RetryPolicy>,
    submit_calls: usize,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            service_name: None,
            http: None,
            timeout: Duration::from_secs(30),
            token: TokenSource::File(DEFAULT_TOKEN_FILE.into()),
            retry: None,
            submit_calls: DEFAULT_SUBMIT_CALLS,
        }
    }
}

impl ClientBuilder {
    /// Base URL of the asyncd API (default [`DEFAULT_ENDPOINT`]).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into();
        self
    }

    /// Names the submitting service: sent as `Asyncd-Source-Service` and as
    /// `source_service` in submit bodies, for `asyncd_task_submitted_total`.
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// Uses `http` for every call instead of a client of this builder's own.
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// Per-call timeout of the builder's own HTTP client (default 30 s; ignored with
    /// [`http_client`](Self::http_client)).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends `token` as `Authorization: Bearer <token>` on every API call (an API token
    /// of `asyncd api --auth tokens`, or a Kubernetes token for `--auth kubernetes`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = TokenSource::Static(token.into());
        self
    }

    /// Reads the bearer token from `path`, again every [`TOKEN_FILE_REFRESH`] (projected
    /// tokens rotate); a missing file sends no token. Default: [`DEFAULT_TOKEN_FILE`].
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token = TokenSource::File(path.into());
        self
    }

    /// Sends an API call again after a retryable failure, as `policy` says (off unless
    /// set): see [`RetryPolicy`]. Heartbeats and results are not retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// How many submit calls the client has in flight at once (default
    /// [`DEFAULT_SUBMIT_CALLS`]). While they are all busy, further concurrent
    /// [`Client::submit`]s queue and go together in the next free call, as one
    /// `POST /v1/tasks:batch` of up to 1000 tasks and 1 MiB whose items the API judges one
    /// by one: each submit still returns its own task's result or error, exactly as
    /// alone. A submit that finds a call free is sent at once, alone, as `POST /v1/tasks`,
    /// so a caller submitting one task at a time sees no difference. This is how a Kafka
    /// producer or a pipelining Redis client (BullMQ's) turns many small concurrent
    /// writes into few round trips.
    ///
    /// `0` turns it off: every submit is its own call. A task with a trace
    /// ([`Task::trace`]) is always its own call, because a batch's tasks all join the
    /// batch request's trace. A call that fails as a whole fails each submit in it (an
    /// error that cannot be copied comes as [`Error::Shared`]); a [`RetryPolicy`] retries
    /// the call as a whole.
    pub fn submit_coalescing(mut self, calls: usize) -> Self {
        self.submit_calls = calls;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        let endpoint = self.endpoint.trim_end_matches('/').to_string();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::Config(format!(
                "endpoint {endpoint:?} is not an http:// or https:// URL"
            )));
        }
        let http = match self.http {
            Some(http) => http,
            None => reqwest::Client::builder()
                .timeout(self.timeout)
                .build()
                .map_err(|e| Error::Config(e.to_string()))?,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint,
                service_name: self.service_name,
                http,
                token: self.token,
                file_token: Mutex::new(None),
                retry: self.retry,
                coalesce: (self.submit_calls > 0)
                    .then(|| Arc::new(Coalescer::new(self.submit_calls))),
            }),
        })
    }
}
