//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's
//! `leaderelection` package does it: several operator replicas run, one reconciles.
//!
//! - A replica takes the Lease when nobody holds it, or when the holder's record has not
//!   changed for `lease_duration` *as this replica observed it* (its own monotonic clock,
//!   not the holder's `renewTime`, so clock skew between nodes cannot cut a lease short).
//! - Every write is a `replace` carrying the `resourceVersion` that was read: of two
//!   replicas racing for an expired lease, the API server lets exactly one win (409 for
//!   the other).
//! - The leader renews every `retry_period`; if it has not renewed for `renew_deadline`
//!   (< `lease_duration`) it gives up leadership, so it stops reconciling before anyone
//!   else may take over.
//! - A leader shutting down (SIGTERM) releases the Lease (empty holder), so a standby
//!   takes over at its next retry instead of after `lease_duration`.
//!
//! A replica killed without warning is replaced after at most
//! `lease_duration + retry_period` (plus one API round trip).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Error};
use tracing::{info, warn};

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What a look at the Lease found, as far as a decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<String>,
    transitions: i32,
}

pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The last record seen and when (this replica's clock) it was first seen.
    observed: Mutex<Option<(Record, Instant)>>,
}

/// The outcome of one try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the lease now.
    Held,
    /// Another replica holds a lease that has not expired.
    HeldByOther,
}

impl Elector {
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: Mutex::new(None),
        }
    }

    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        let mut waiting_logged = false;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    info!(
                        lease = %self.settings.name,
                        identity = %self.settings.identity,
                        "became the leader"
                    );
                    return;
                }
                Ok(Attempt::HeldByOther) => {
                    if !waiting_logged {
                        let holder = self.holder().unwrap_or_default();
                        info!(lease = %self.settings.name, %holder, "standing by: another replica leads");
                        waiting_logged = true;
                    }
                }
                Err(e) => {
                    warn!(lease = %self.settings.name, error = %e, "lease: could not read or take it")
                }
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Renews the lease every `retry_period`; returns when leadership is lost: another
    /// replica holds the lease, or no renewal succeeded for `renew_deadline`.
    pub async fn hold(&self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => renewed = Instant::now(),
                Ok(Attempt::HeldByOther) => {
                    warn!(lease = %self.settings.name, holder = %self.holder().unwrap_or_default(), "lost the lease to another replica");
                    return;
                }
                Err(e) => {
                    warn!(lease = %self.settings.name, error = %e, "lease renewal failed");
                    if renewed.elapsed() >= self.settings.renew_deadline {
                        warn!(lease = %self.settings.name, "no renewal within the renew deadline: giving up leadership");
                        return;
                    }
                }
            }
        }
    }

    /// Gives the lease up (shutdown), so a standby need not wait for it to expire.
    pub async fn release(&self) {
        let result: Result<(), Error> = async {
            let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&self.settings.name, &PostParams::default(), &lease)
                .await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => info!(lease = %self.settings.name, "released the lease"),
            Err(e) => warn!(lease = %self.settings.name, error = %e, "could not release the lease"),
        }
    }

    fn holder(&self) -> Option<String> {
        self.observed
            .lock()
            .unwrap()
            .as_ref()
            .map(|(r, _)| r.holder.clone())
    }

    /// One look at the Lease: create it, take it over when expired, or renew our own.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, Error> {
        let s = &self.settings;
        let now = MicroTime(Timestamp::now());
        let duration_secs = s.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&s.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldByOther),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew_time: spec
                .renew_time
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| spec.acquire_time.as_ref().map(|t| t.0.to_string())),
            transitions: spec.lease_transitions.unwrap_or(0),
        };
        let lease_secs = spec
            .lease_duration_seconds
            .map(|d| Duration::from_secs(d.max(0) as u64))
            .unwrap_or(s.lease_duration);
        let first_seen = {
            let mut observed = self.observed.lock().unwrap();
            match observed.as_ref() {
                Some((r, at)) if *r == record => *at,
                _ => {
                    let at = Instant::now();
                    *observed = Some((record.clone(), at));
                    at
                }
            }
        };
        let ours = record.holder == s.identity;
        if !ours && !record.holder.is_empty() && first_seen.elapsed() < lease_secs {
            return Ok(Attempt::HeldByOther);
        }
        let new_spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            new_spec.acquire_time = Some(now.clone());
            new_spec.lease_transitions = Some(record.transitions + 1);
        }
        new_spec.holder_identity = Some(s.identity.clone());
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(now);
        // `lease` still carries the resourceVersion we read: a concurrent writer gets 409
        match self
            .api
            .replace(&s.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Held),
            Err(Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldByOther),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{ApiServer, Reply};

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/shop/leases";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/shop/leases/asyncd-operator";

    fn elector(client: Client) -> Elector {
        Elector::new(
            client,
            LeaseSettings {
                namespace: "shop".into(),
                name: "asyncd-operator".into(),
                identity: "me".into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
        )
    }

    fn lease(holder: Option<&str>, renewed: &str, duration: i32, transitions: i32) -> Reply {
        Reply::Json(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "asyncd-operator", "namespace": "shop", "resourceVersion": "42"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": renewed,
                     "leaseTransitions": transitions},
        }))
    }

    #[tokio::test]
    async fn creates_the_lease_when_there_is_none() {
        let (server, client) = ApiServer::start();
        server
            .expect("GET", LEASE, Reply::Status(404))
            .expect("POST", LEASES, Reply::Echo);
        let e = elector(client);
        assert_eq!(e.try_acquire_or_renew().await.unwrap(), Attempt::Held);
        let calls = server.verify();
        let spec = &calls[1].body["spec"];
        assert_eq!(spec["holderIdentity"], "me");
        assert_eq!(spec["leaseDurationSeconds"], 15);
        assert_eq!(spec["leaseTransitions"], 0);
    }

    #[tokio::test]
    async fn a_lost_create_race_is_standing_by() {
        let (server, client) = ApiServer::start();
        server
            .expect("GET", LEASE, Reply::Status(404))
            .expect("POST", LEASES, Reply::Status(409));
        let e = elector(client);
        assert_eq!(
            e.try_acquire_or_renew().await.unwrap(),
            Attempt::HeldByOther
        );
        server.verify();
    }

    #[tokio::test]
    async fn waits_out_a_live_lease_then_takes_over_an_unrenewed_one() {
        let (server, client) = ApiServer::start();
        let renewed = "2026-01-01T00:00:10.000000Z";
        server
            // the holder renews: the record changes, so it stays live however old its time
            .expect("GET", LEASE, lease(Some("other"), renewed, 1, 3))
            .expect(
                "GET",
                LEASE,
                lease(Some("other"), "2026-01-01T00:00:11.000000Z", 1, 3),
            )
            // then it stops renewing: once the same record has been seen for the lease's
            // duration (by our clock), the lease is ours, with the version we read
            .expect(
                "GET",
                LEASE,
                lease(Some("other"), "2026-01-01T00:00:11.000000Z", 1, 3),
            )
            .expect("PUT", LEASE, Reply::Echo);
        let e = elector(client);
        assert_eq!(
            e.try_acquire_or_renew().await.unwrap(),
            Attempt::HeldByOther
        );
        assert_eq!(
            e.try_acquire_or_renew().await.unwrap(),
            Attempt::HeldByOther
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(e.try_acquire_or_renew().await.unwrap(), Attempt::Held);
        let calls = server.verify();
        let put = &calls[3].body;
        assert_eq!(put["metadata"]["resourceVersion"], "42");
        assert_eq!(put["spec"]["holderIdentity"], "me");
        assert_eq!(put["spec"]["leaseTransitions"], 4);
        assert_eq!(put["spec"]["leaseDurationSeconds"], 15);
        assert_ne!(put["spec"]["acquireTime"], "2026-01-01T00:00:00.000000Z");
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_once_and_a_conflict_means_someone_was_faster() {
        let (server, client) = ApiServer::start();
        server
            .expect(
                "GET",
                LEASE,
                lease(None, "2026-01-01T00:00:10.000000Z", 1, 3),
            )
            .expect("PUT", LEASE, Reply::Status(409));
        let e = elector(client);
        assert_eq!(
            e.try_acquire_or_renew().await.unwrap(),
            Attempt::HeldByOther
        );
        server.verify();
    }

    #[tokio::test]
    async fn renews_its_own_lease_and_releases_it() {
        let (server, client) = ApiServer::start();
        server
            .expect(
                "GET",
                LEASE,
                lease(Some("me"), "2026-01-01T00:00:10.000000Z", 15, 2),
            )
            .expect("PUT", LEASE, Reply::Echo)
            .expect(
                "GET",
                LEASE,
                lease(Some("me"), "2026-01-01T00:00:12.000000Z", 15, 2),
            )
            .expect("PUT", LEASE, Reply::Echo);
        let e = elector(client);
        assert_eq!(e.try_acquire_or_renew().await.unwrap(), Attempt::Held);
        e.release().await;
        let calls = server.verify();
        let renew = &calls[1].body["spec"];
        assert_eq!(renew["acquireTime"], "2026-01-01T00:00:00.000000Z");
        assert_eq!(renew["leaseTransitions"], 2);
        assert_ne!(renew["renewTime"], "2026-01-01T00:00:10.000000Z");
        let release = &calls[3].body["spec"];
        assert!(release["holderIdentity"].is_null(), "{release}");
        assert_eq!(release["leaseDurationSeconds"], 1);
    }
}
