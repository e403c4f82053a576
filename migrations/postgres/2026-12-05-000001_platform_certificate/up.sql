-- The platform certificates downloaded from the providers (WeChat Pay GET /v3/certificates),
-- decrypted and checked: every instance verifies with what one of them fetched, and a restart
-- needs no network. One row per certificate; a later download of the same one only moves
-- fetched_at. Configured keys (platform_keys) are not stored here: they stay in their files.
CREATE TABLE platform_certificate (
    channel      VARCHAR(16)  NOT NULL,
    mchid        VARCHAR(64)  NOT NULL,
    serial       VARCHAR(64)  NOT NULL,
    -- The certificate as PEM, exactly as it decrypted.
    certificate  TEXT         NOT NULL,
    effective_at TIMESTAMPTZ  NOT NULL,
    expire_at    TIMESTAMPTZ  NOT NULL,
    fetched_at   TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (channel, mchid, serial)
);
