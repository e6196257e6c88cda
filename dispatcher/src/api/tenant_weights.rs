//! Tenants' weights set at runtime (docs/api.md, "Tenants' weights at runtime"): `PUT
//! /v1/jobs/{name}/tenants/{tenant}/weight` gives a tenant of a `spec.fairness` job a
//! weight in its fair claim in place of the spec's, `DELETE` the same path gives it back
//! the spec's. The dispatchers read a job's runtime weights at each of its fair claims.
//! The right to pause a job is the right to change its tenants' weights: both change how
//! its work is shared out, not what it is.

use asyncd_contract::{TenantWeight, TenantWeightRequest};
use asyncd_spec::{TENANT_SEPARATOR, Tenants};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;

use super::error::ApiError;
use super::extract::Path;
use super::jobs::named_job;
use super::submit::{parse_json, plain_text};
use super::{ApiState, AppState};
use crate::auth::{Caller, Verb};

/// The longest tenant accepted: a tenant is a prefix of a stored concurrency key.
const MAX_TENANT_BYTES: usize = 255;

/// `PUT /v1/jobs/{name}/tenants/{tenant}/weight`.
pub(super) async fn put(
    State(state): AppState,
    caller: Caller,
    Path((name, tenant)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TenantWeight>, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    let request: TenantWeightRequest = parse_json(&body)?;
    let (job, tenants) = fair_job(&state, &caller, &name, &tenant).await?;
    if !(1..=Tenants::MAX_WEIGHT).contains(&request.weight) {
        return Err(ApiError::field(
            "weight",
            format!("must be 1 to {}", Tenants::MAX_WEIGHT),
        ));
    }
    let set = state.store.tenant_weights(&job.task_type).await?;
    if !set.contains_key(&tenant) && set.len() >= Tenants::MAX_WEIGHTS {
        return Err(ApiError::field(
            "tenant",
            format!(
                "job {:?} has {} tenants with a weight set at runtime, the most it may \
                 have; delete one first",
                job.name,
                set.len()
            ),
        ));
    }
    let now = state.clock.now_millis();
    state
        .store
        .set_tenant_weight(&job.task_type, &tenant, Some(request.weight), now)
        .await?;
    tracing::info!(
        caller = caller.name(),
        job = job.name,
        tenant,
        weight = request.weight,
        spec_weight = tenants.weight_of(&tenant),
        "tenant weight set"
    );
    Ok(Json(TenantWeight {
        job: job.name.clone(),
        tenant,
        weight: request.weight,
        set_at_runtime: true,
    }))
}

/// `DELETE /v1/jobs/{name}/tenants/{tenant}/weight`: back to the spec's weight
/// (idempotent).
pub(super) async fn delete(
    State(state): AppState,
    caller: Caller,
    Path((name, tenant)): Path<(String, String)>,
) -> Result<Json<TenantWeight>, ApiError> {
    let (job, tenants) = fair_job(&state, &caller, &name, &tenant).await?;
    let now = state.clock.now_millis();
    if state
        .store
        .set_tenant_weight(&job.task_type, &tenant, None, now)
        .await?
    {
        tracing::info!(
            caller = caller.name(),
            job = job.name,
            tenant,
            "tenant weight reset"
        );
    }
    Ok(Json(TenantWeight {
        job: job.name.clone(),
        weight: tenants.weight_of(&tenant),
        tenant,
        set_at_runtime: false,
    }))
}

/// The job named `name`, which the caller may pause, with its `spec.fairness`; refuses
/// a job without one, and a tenant no key of the job could carry.
async fn fair_job(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    tenant: &str,
) -> Result<(std::sync::Arc<asyncd_spec::Job>, Tenants), ApiError> {
    let job = named_job(state, caller, name, Verb::Pause).await?;
    let Some(tenants) = job
        .concurrency_key
        .as_ref()
        .and_then(|key| key.tenants.clone())
    else {
        return Err(ApiError::field(
            "name",
            format!("job {name:?} has no spec.fairness: it has no tenants to weigh"),
        ));
    };
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES {
        return Err(ApiError::field(
            "tenant",
            format!("must be 1 to {MAX_TENANT_BYTES} bytes"),
        ));
    }
    if tenant.contains(TENANT_SEPARATOR) {
        return Err(ApiError::field(
            "tenant",
            "must not contain U+001F, the separator of tenant and key",
        ));
    }
    plain_text("tenant", tenant)?;
    Ok((job, tenants))
}
