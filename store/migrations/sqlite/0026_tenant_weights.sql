-- Tenants' weights set at runtime (`PUT /v1/jobs/{name}/tenants/{tenant}/weight`;
-- docs/design.md, "Fairness between tenants"): one row per job and tenant, overriding
-- the weight `spec.fairness` gives that tenant until it is deleted. The dispatchers read
-- a job's rows at each fair claim of it, so a change holds from the next claim on.
CREATE TABLE tenant_weights (
    task_type  TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    weight     INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (task_type, tenant)
);
