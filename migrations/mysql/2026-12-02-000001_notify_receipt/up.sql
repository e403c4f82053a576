-- What arrived at a notify URL and what it was answered (receipts.store): diagnostics, not
-- the ledger. Written off the hot path; purged after receipts.keep_days. LONGTEXT: a body of
-- up to server.max_body_bytes (16 MiB) is larger once in base64.
CREATE TABLE notify_receipt (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    channel         VARCHAR(16)  NOT NULL,
    received_at     DATETIME(6)  NOT NULL,
    peer            VARCHAR(64),
    request_id      VARCHAR(64),
    headers         JSON         NOT NULL,
    body_b64        LONGTEXT     NOT NULL,
    body_bytes      INTEGER      NOT NULL,
    status          SMALLINT     NOT NULL,
    outcome         VARCHAR(32)  NOT NULL,
    detail          TEXT,
    out_trade_no    VARCHAR(64),
    reapplied_at    DATETIME(6),
    reapply_outcome VARCHAR(32),
    INDEX notify_receipt_received_at (received_at),
    INDEX notify_receipt_outcome_received_at (outcome, received_at),
    INDEX notify_receipt_out_trade_no (out_trade_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
