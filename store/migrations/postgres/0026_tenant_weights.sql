-- See migrations/sqlite/0026_tenant_weights.sql.
CREATE TABLE tenant_weights (
    task_type TEXT COLLATE "C" NOT NULL,
    tenant TEXT COLLATE "C" NOT NULL,
    weight BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (task_type, tenant)
);
