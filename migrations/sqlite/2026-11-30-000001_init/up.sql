-- Column names are part of the public contract (interface.md, "Database tables").
-- Times are TEXT in RFC 3339 UTC with microseconds (sortable); amounts are INTEGER fen.

CREATE TABLE orders (
    order_no       VARCHAR(64)  PRIMARY KEY,
    status         VARCHAR(16)  NOT NULL DEFAULT 'WAIT_PAY'
                   CHECK (status IN ('WAIT_PAY', 'PAID', 'REFUNDED', 'CLOSED')),
    amount_fen     BIGINT       NOT NULL CHECK (amount_fen > 0),
    refunded_fen   BIGINT       NOT NULL DEFAULT 0 CHECK (refunded_fen >= 0 AND refunded_fen <= amount_fen),
    currency       VARCHAR(8)   NOT NULL,
    subject        TEXT         NOT NULL,
    channel        VARCHAR(16),
    transaction_id VARCHAR(64),
    created_at     TEXT         NOT NULL,
    paid_at        TEXT,
    closed_at      TEXT,
    expire_at      TEXT         NOT NULL
);
-- The expiry job reads only unpaid orders, oldest deadline first.
CREATE INDEX orders_wait_pay_expire_at ON orders (expire_at) WHERE status = 'WAIT_PAY';

-- One row per order and channel paid; the primary key is the first-vs-duplicate arbiter.
CREATE TABLE pay_callback (
    out_trade_no   VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    transaction_id VARCHAR(64)  NOT NULL,
    amount_fen     BIGINT       NOT NULL,
    digest         CHAR(64)     NOT NULL,
    created_at     TEXT         NOT NULL,
    PRIMARY KEY (out_trade_no, channel)
);
CREATE INDEX pay_callback_created_at ON pay_callback (created_at);

CREATE TABLE refund_callback (
    out_refund_no  VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    out_trade_no   VARCHAR(64)  NOT NULL,
    refund_id      VARCHAR(128) NOT NULL,
    refund_fen     BIGINT       NOT NULL,
    status         VARCHAR(16)  NOT NULL,
    digest         CHAR(64)     NOT NULL,
    created_at     TEXT         NOT NULL,
    -- (out_refund_no, channel) within an order: Alipay's out_request_no is only unique
    -- within one trade, so two orders may both have refund "1".
    PRIMARY KEY (out_refund_no, channel, out_trade_no)
);
CREATE INDEX refund_callback_out_trade_no ON refund_callback (out_trade_no);
CREATE INDEX refund_callback_created_at ON refund_callback (created_at);

-- The transactional outbox. status: 0 pending, 1 sent, 2 dead.
CREATE TABLE local_message (
    id              INTEGER      PRIMARY KEY AUTOINCREMENT,
    topic           VARCHAR(32)  NOT NULL,
    biz_key         VARCHAR(200) NOT NULL,
    payload         TEXT         NOT NULL,
    status          SMALLINT     NOT NULL DEFAULT 0 CHECK (status IN (0, 1, 2)),
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at TEXT         NOT NULL,
    locked_by       TEXT,
    locked_until    TEXT,
    last_error      TEXT,
    created_at      TEXT         NOT NULL,
    sent_at         TEXT,
    CONSTRAINT local_message_topic_biz_key UNIQUE (topic, biz_key)
);
-- The relay claims due pending rows in this order; a partial index keeps sent rows out of it.
CREATE INDEX local_message_pending_due ON local_message (next_attempt_at, id) WHERE status = 0;
CREATE INDEX local_message_status_created ON local_message (status, created_at);
-- Retention purges sent rows by delivery time.
CREATE INDEX local_message_sent_at ON local_message (sent_at) WHERE status = 1;

-- Stored answers of POST /orders, replayed byte for byte for a repeated Idempotency-Key.
CREATE TABLE idempotency_key (
    idem_key        VARCHAR(255) PRIMARY KEY,
    request_digest  CHAR(64)     NOT NULL,
    response_status SMALLINT     NOT NULL,
    response_body   TEXT         NOT NULL,
    created_at      TEXT         NOT NULL
);
CREATE INDEX idempotency_key_created_at ON idempotency_key (created_at);
