-- Provider accounts added through /admin/merchants (src/merchants), beside those of the
-- configuration file. Rows are never deleted: a disabled account's orders, callbacks and
-- reports stay readable. Account ids are VARBINARY, compared byte for byte
-- (2026-12-11-000001_keys_without_padding).
CREATE TABLE merchant_account (
    channel      VARCHAR(16)    NOT NULL,
    -- The WeChat mchid (a sub-merchant's sub_mchid) or Alipay app_id (a partner_sub's
    -- auth_app_id).
    account      VARBINARY(256) NOT NULL,
    mode         VARCHAR(16)    NOT NULL CHECK (mode IN ('direct', 'partner_sub')),
    -- A partner_sub's service provider (mchid) or ISV app (app_id); NULL for direct.
    sp_account   VARBINARY(256),
    -- The settings that are not keys, as JSON (appids, seller_id, api_base, certificates).
    settings     TEXT           NOT NULL,
    status       VARCHAR(16)    NOT NULL CHECK (status IN ('enabled', 'disabled')),
    -- Bumped by every change: an update names the version it read (optimistic).
    keys_version BIGINT         NOT NULL,
    -- The keys object, AES-256-GCM under secrets.master_key: base64 of nonce, ciphertext and
    -- tag; key_id is the first 8 hex digits of SHA-256 of the key that sealed it.
    key_id       VARCHAR(8)     NOT NULL,
    -- MEDIUMTEXT: a list of platform certificates can pass TEXT's 64 KiB.
    sealed_keys  MEDIUMTEXT     NOT NULL,
    created_at   DATETIME(6)    NOT NULL,
    updated_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (channel, account)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
-- Each instance's reload: the rows changed since its last read.
CREATE INDEX merchant_account_updated ON merchant_account (updated_at);
-- A service provider's sub-merchants.
CREATE INDEX merchant_account_sp ON merchant_account (channel, sp_account);
