-- The old code knows a recorded anomaly by its message: put back those retention dropped.
INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at)
    SELECT 'PAYMENT_ANOMALY', a.biz_key, a.payload, 1, 0, a.created_at, a.created_at, a.created_at
    FROM payment_anomaly a
    WHERE NOT EXISTS (SELECT 1 FROM local_message m
                      WHERE m.topic = 'PAYMENT_ANOMALY' AND m.biz_key = a.biz_key);
CREATE INDEX local_message_sent_at ON local_message (sent_at) WHERE status = 1;
DROP TABLE payment_anomaly;
