-- SQLite has no partitions: retention keeps deleting in batches. Payment anomalies get their
-- own table here too, as on the other backends (docs/design.md, "Partitions"): one per key,
-- kept as long as their order, so the outbox row can go with the other sent messages.
CREATE TABLE payment_anomaly (
    biz_key    VARCHAR(255) PRIMARY KEY,
    order_no   VARCHAR(64)  NOT NULL,
    payload    TEXT         NOT NULL,
    created_at TEXT         NOT NULL
);
CREATE INDEX payment_anomaly_order_no ON payment_anomaly (order_no);
INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at)
    SELECT biz_key, COALESCE(json_extract(payload, '$.order_no'), ''), payload, created_at
    FROM local_message WHERE topic = 'PAYMENT_ANOMALY';
-- Sent messages go by the day they were written (as the partitions do elsewhere), served by
-- local_message_status_created.
DROP INDEX local_message_sent_at;
