-- Provider ids at their documented maxima (src/notice.rs, `max_len`): an Alipay refund id is
-- `trade_no:out_biz_no`, 64 + 1 + 64 characters; the longest outbox key is a refund anomaly's
-- `{order_no}:{channel}:{refund id}`, 64 + 1 + 16 + 1 + 129.
ALTER TABLE refund_callback ALTER COLUMN refund_id TYPE VARCHAR(160);
ALTER TABLE local_message ALTER COLUMN biz_key TYPE VARCHAR(255);

-- Notifications that are recorded and acknowledged but change no order (Alipay TRADE_CLOSED
-- without a refund). Kept, like the other callback rows, as long as the order.
CREATE TABLE status_callback (
    out_trade_no   VARCHAR(64)  NOT NULL,
    channel        VARCHAR(16)  NOT NULL,
    transaction_id VARCHAR(64)  NOT NULL,
    status         VARCHAR(32)  NOT NULL,
    amount_fen     BIGINT       NOT NULL,
    created_at     TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (out_trade_no, channel, transaction_id, status)
);
