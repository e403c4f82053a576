-- What arrived at a notify URL and what it was answered (receipts.store): diagnostics, not
-- the ledger. Written off the hot path; purged after receipts.keep_days.
CREATE TABLE notify_receipt (
    id              BIGSERIAL    PRIMARY KEY,
    channel         VARCHAR(16)  NOT NULL,
    received_at     TIMESTAMPTZ  NOT NULL,
    peer            VARCHAR(64),
    request_id      VARCHAR(64),
    -- {"header-name": ["value", …]}: Wechatpay-*, Content-Type, Content-Length, User-Agent.
    headers         JSONB        NOT NULL,
    -- The raw body, base64 (bounded by server.max_body_bytes).
    body_b64        TEXT         NOT NULL,
    body_bytes      INTEGER      NOT NULL,
    status          SMALLINT     NOT NULL,
    outcome         VARCHAR(32)  NOT NULL,
    detail          TEXT,
    out_trade_no    VARCHAR(64),
    reapplied_at    TIMESTAMPTZ,
    reapply_outcome VARCHAR(32)
);
CREATE INDEX notify_receipt_received_at ON notify_receipt (received_at);
CREATE INDEX notify_receipt_outcome_received_at ON notify_receipt (outcome, received_at);
CREATE INDEX notify_receipt_out_trade_no ON notify_receipt (out_trade_no);
