-- The daily bill reconciliation (src/bills). One report per (bill date, channel, account):
-- a rerun replaces it. Dates are provider-local days, as YYYY-MM-DD.
CREATE TABLE bill_report (
    bill_date             VARCHAR(10)  NOT NULL,
    channel               VARCHAR(16)  NOT NULL,
    account               VARCHAR(64)  NOT NULL,
    -- balanced, mismatched, unavailable
    status                VARCHAR(16)  NOT NULL,
    -- Why it is unavailable.
    reason                TEXT,
    fetched_at            TEXT  NOT NULL,
    provider_count        BIGINT       NOT NULL,
    provider_amount_fen   BIGINT       NOT NULL,
    provider_refund_count BIGINT       NOT NULL,
    provider_refund_fen   BIGINT       NOT NULL,
    provider_fee_fen      BIGINT       NOT NULL,
    ours_count            BIGINT       NOT NULL,
    ours_amount_fen       BIGINT       NOT NULL,
    ours_refund_count     BIGINT       NOT NULL,
    ours_refund_fen       BIGINT       NOT NULL,
    PRIMARY KEY (bill_date, channel, account)
);

-- A difference a report found. out_refund_no is '' for a payment.
CREATE TABLE bill_item (
    bill_date        VARCHAR(10)  NOT NULL,
    channel          VARCHAR(16)  NOT NULL,
    account          VARCHAR(64)  NOT NULL,
    item_type        VARCHAR(32)  NOT NULL,
    out_trade_no     VARCHAR(64)  NOT NULL,
    out_refund_no    VARCHAR(64)  NOT NULL,
    transaction_id   VARCHAR(64),
    provider_status  VARCHAR(32),
    provider_fen     BIGINT,
    ours_status      VARCHAR(32),
    ours_fen         BIGINT,
    -- recovered, open, pending
    resolution       VARCHAR(16)  NOT NULL,
    PRIMARY KEY (bill_date, channel, account, item_type, out_trade_no, out_refund_no)
);
CREATE INDEX bill_item_key ON bill_item (channel, out_trade_no);

-- The detail rows of the bills being compared, while a run of (bill date, channel) lasts:
-- the comparison is set-based SQL over them. Emptied when the run ends.
CREATE TABLE bill_line (
    bill_date        VARCHAR(10)  NOT NULL,
    channel          VARCHAR(16)  NOT NULL,
    -- payment, refund
    kind             VARCHAR(8)   NOT NULL,
    out_trade_no     VARCHAR(64)  NOT NULL,
    out_refund_no    VARCHAR(64)  NOT NULL,
    account          VARCHAR(64)  NOT NULL,
    transaction_id   VARCHAR(64)  NOT NULL,
    amount_fen       BIGINT       NOT NULL,
    status           VARCHAR(32)  NOT NULL,
    PRIMARY KEY (bill_date, channel, kind, out_trade_no, out_refund_no)
);

-- Who is reconciling (bill date, channel) now: one instance at a time, until locked_until.
CREATE TABLE bill_run (
    bill_date        VARCHAR(10)  NOT NULL,
    channel          VARCHAR(16)  NOT NULL,
    locked_by        VARCHAR(128) NOT NULL,
    locked_until     TEXT  NOT NULL,
    PRIMARY KEY (bill_date, channel)
);
