-- Merchant transfers started through paynotify (src/transfers): each is recorded here, its
-- caps checked under its account's lock, before its provider is called; then sent again
-- under the same out_bill_no, or queried, until it is final.
CREATE TABLE transfer (
    out_bill_no      VARBINARY(128) NOT NULL PRIMARY KEY,
    channel          VARCHAR(16)  NOT NULL,
    -- The WeChat mchid or Alipay app_id the money leaves from.
    account          VARBINARY(256) NOT NULL,
    amount_fen       BIGINT       NOT NULL CHECK (amount_fen > 0),
    remark           VARCHAR(32)  NOT NULL,
    -- Who is paid, as shown: {"openid"} or {"identity", "identity_type"} (never a name).
    payee            TEXT         NOT NULL,
    -- The call exactly as it is sent every time (names included; never shown), and the
    -- digest of the request body that asked for it: the same body again is the same transfer.
    request          TEXT         NOT NULL,
    request_digest   CHAR(64)     NOT NULL,
    -- PROCESSING, WAIT_USER_CONFIRM, SUCCESS, FAIL, CANCELLED
    status           VARCHAR(24)  NOT NULL,
    -- The provider's own latest state; NULL until it answered.
    provider_state   VARCHAR(32),
    provider_bill_no VARCHAR(64),
    package_info     TEXT,
    fail_reason      VARCHAR(64),
    -- Calls made (sends and queries), and when the next one is due.
    attempts         INTEGER      NOT NULL,
    next_attempt_at  DATETIME(6)   NOT NULL,
    created_at       DATETIME(6)   NOT NULL,
    updated_at       DATETIME(6)   NOT NULL,
    finished_at      DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
-- The daily limit's sum: an account's transfers since Beijing midnight.
CREATE INDEX transfer_account_created ON transfer (account, created_at);
-- The job's scan: the transfers that are not final, by when they are due.
CREATE INDEX transfer_due ON transfer (status, next_attempt_at);
CREATE INDEX transfer_status ON transfer (status, created_at);

-- One row per account that ever sent a transfer: the row its transfers are recorded under
-- the lock of, so two requests cannot both pass the daily limit.
CREATE TABLE transfer_account (
    channel VARCHAR(16) NOT NULL,
    account VARBINARY(256) NOT NULL,
    PRIMARY KEY (channel, account)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- Transfer anomalies, one per key: what makes a repeat of an anomalous notification a
-- duplicate once its outbox row is gone.
CREATE TABLE transfer_anomaly (
    biz_key     VARBINARY(1020) NOT NULL PRIMARY KEY,
    out_bill_no VARBINARY(256)  NOT NULL,
    payload     JSON         NOT NULL,
    created_at  DATETIME(6)   NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
