-- See migrations/sqlite/0026_tenant_weights.sql. Tenants compare byte for byte, as
-- the keys do.
CREATE TABLE tenant_weights (
    task_type VARCHAR(255) NOT NULL,
    tenant VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    weight BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (task_type, tenant)
) ENGINE = InnoDB;
