-- Refunds started through paynotify (src/refunds): each is recorded here before its provider
-- is called, and sent again under the same out_refund_no until the provider answers.
CREATE TABLE refund_request (
    out_refund_no    VARCHAR(64)  NOT NULL,
    order_no         VARCHAR(64)  NOT NULL,
    channel          VARCHAR(16)  NOT NULL,
    -- The WeChat mchid or Alipay app_id the refund is sent through.
    account          VARCHAR(64)  NOT NULL,
    transaction_id   VARCHAR(64)  NOT NULL,
    amount_fen       BIGINT       NOT NULL CHECK (amount_fen > 0),
    -- The payment's amount when the refund was asked for.
    total_fen        BIGINT       NOT NULL,
    reason           VARCHAR(80),
    -- SUBMITTING, PROCESSING, SUCCESS, CLOSED, ABNORMAL
    status           VARCHAR(16)  NOT NULL,
    refund_id        VARCHAR(129),
    -- The provider refused (nothing was created under this number): its code and message.
    error_code       VARCHAR(64),
    error_message    TEXT,
    -- Calls made (creates and queries), and when the next one is due.
    attempts         INTEGER      NOT NULL,
    next_attempt_at  TEXT  NOT NULL,
    created_at       TEXT  NOT NULL,
    updated_at       TEXT  NOT NULL,
    PRIMARY KEY (out_refund_no)
);
CREATE INDEX refund_request_order ON refund_request (order_no);
-- The job's scan: the requests that are not final, by when they are due.
CREATE INDEX refund_request_due ON refund_request (next_attempt_at)
    WHERE status IN ('SUBMITTING', 'PROCESSING', 'ABNORMAL');
