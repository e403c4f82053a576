-- Column names are part of the public contract (interface.md, "Database tables").
-- InnoDB, utf8mb4, ROW_FORMAT=DYNAMIC: index keys up to 3072 bytes (COMPACT would cap them at
-- 767 bytes, 191 utf8mb4 characters). The widest key here, local_message (topic, biz_key), is
-- (32 + 255) * 4 = 1148 bytes. Times are DATETIME(6) in UTC (every session sets
-- time_zone = '+00:00'); amounts are BIGINT fen. MySQL has no partial indexes: the status
-- leads the indexes that the relay, expiry and retention read.

CREATE TABLE orders (
    order_no       VARCHAR(64)  NOT NULL PRIMARY KEY,
    status         VARCHAR(16)  NOT NULL DEFAULT 'WAIT_PAY'
                   CHECK (status IN ('WAIT_PAY', 'PAID', 'REFUNDED', 'CLOSED')),
    amount_fen     BIGINT       NOT NULL CHECK (amount_fen > 0),
    refunded_fen   BIGINT       NOT NULL DEFAULT 0 CHECK (refunded_fen >= 0 AND refunded_fen <= amount_fen),
    currency       VARCHAR(8)   NOT NULL,
    subject        TEXT         NOT NULL,
    channel        VARCHAR(16),
    transaction_id VARCHAR(64),
    created_at     DATETIME(6)  NOT NULL,
    paid_at        DATETIME(6),
    closed_at      DATETIME(6),
    expire_at      DATETIME(6)  NOT NULL,
    INDEX orders_status_expire_at (status, expire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- One row per order and channel paid; the primary key is the first-vs-duplicate arbiter.
CREATE TABLE pay_callback (
    out_trade_no   VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    transaction_id VARCHAR(64)  NOT NULL,
    amount_fen     BIGINT       NOT NULL,
    digest         CHAR(64)     NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (out_trade_no, channel),
    INDEX pay_callback_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

CREATE TABLE refund_callback (
    out_refund_no  VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    out_trade_no   VARCHAR(64)  NOT NULL,
    refund_id      VARCHAR(160) NOT NULL,
    refund_fen     BIGINT       NOT NULL,
    status         VARCHAR(16)  NOT NULL,
    digest         CHAR(64)     NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    -- (out_refund_no, channel) within an order: Alipay's out_request_no is only unique
    -- within one trade, so two orders may both have refund "1".
    PRIMARY KEY (out_refund_no, channel, out_trade_no),
    INDEX refund_callback_out_trade_no (out_trade_no),
    INDEX refund_callback_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- Notifications recorded and acknowledged without changing the order (Alipay TRADE_CLOSED).
CREATE TABLE status_callback (
    out_trade_no   VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    transaction_id VARCHAR(64)  NOT NULL,
    status         VARCHAR(32)  NOT NULL,
    amount_fen     BIGINT       NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (out_trade_no, channel, transaction_id, status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- The transactional outbox. status: 0 pending, 1 sent, 2 dead.
CREATE TABLE local_message (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic           VARCHAR(32)  NOT NULL,
    biz_key         VARCHAR(255) NOT NULL,
    payload         JSON         NOT NULL,
    status          SMALLINT     NOT NULL DEFAULT 0 CHECK (status IN (0, 1, 2)),
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NOT NULL,
    locked_by       VARCHAR(255),
    locked_until    DATETIME(6),
    last_error      TEXT,
    created_at      DATETIME(6)  NOT NULL,
    sent_at         DATETIME(6),
    CONSTRAINT local_message_topic_biz_key UNIQUE (topic, biz_key),
    -- The relay claims due pending rows in this order.
    INDEX local_message_pending_due (status, next_attempt_at, id),
    INDEX local_message_status_created (status, created_at),
    -- Retention purges sent rows by delivery time.
    INDEX local_message_sent_at (status, sent_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- Stored answers of POST /orders, replayed byte for byte for a repeated Idempotency-Key.
CREATE TABLE idempotency_key (
    idem_key        VARCHAR(255) NOT NULL PRIMARY KEY,
    request_digest  CHAR(64)     NOT NULL,
    response_status SMALLINT     NOT NULL,
    response_body   TEXT         NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    INDEX idempotency_key_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
