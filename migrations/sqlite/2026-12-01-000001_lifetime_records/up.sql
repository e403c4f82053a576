-- SQLite does not enforce VARCHAR lengths, so the widened PostgreSQL columns need no change
-- here (src/notice.rs `max_len` bounds the values on every backend).

-- Notifications that are recorded and acknowledged but change no order (Alipay TRADE_CLOSED
-- without a refund). Kept, like the other callback rows, as long as the order.
CREATE TABLE status_callback (
    out_trade_no   VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    transaction_id VARCHAR(64)  NOT NULL,
    status         VARCHAR(32)  NOT NULL,
    amount_fen     BIGINT       NOT NULL,
    created_at     TEXT         NOT NULL,
    PRIMARY KEY (out_trade_no, channel, transaction_id, status)
);
