-- Back to single tables: every partition's rows copied into them.
CREATE TABLE local_message_single (LIKE local_message INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
INSERT INTO local_message_single SELECT * FROM local_message;
ALTER SEQUENCE local_message_id_seq OWNED BY local_message_single.id;
DROP TABLE local_message;
ALTER TABLE local_message_single RENAME TO local_message;
ALTER TABLE local_message ADD PRIMARY KEY (id);
-- The old code knows a recorded anomaly by its message: put back those retention dropped.
INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at)
    SELECT 'PAYMENT_ANOMALY', a.biz_key, a.payload, 1, 0, a.created_at, a.created_at, a.created_at
    FROM payment_anomaly a
    WHERE NOT EXISTS (SELECT 1 FROM local_message m
                      WHERE m.topic = 'PAYMENT_ANOMALY' AND m.biz_key = a.biz_key);
ALTER TABLE local_message ADD CONSTRAINT local_message_topic_biz_key UNIQUE (topic, biz_key);
CREATE INDEX local_message_pending_due ON local_message (next_attempt_at, id) WHERE status = 0;
CREATE INDEX local_message_status_created ON local_message (status, created_at);
CREATE INDEX local_message_sent_at ON local_message (sent_at) WHERE status = 1;

CREATE TABLE notify_receipt_single (LIKE notify_receipt INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
INSERT INTO notify_receipt_single SELECT * FROM notify_receipt;
ALTER SEQUENCE notify_receipt_id_seq OWNED BY notify_receipt_single.id;
DROP TABLE notify_receipt;
ALTER TABLE notify_receipt_single RENAME TO notify_receipt;
ALTER TABLE notify_receipt ADD PRIMARY KEY (id);
CREATE INDEX notify_receipt_received_at ON notify_receipt (received_at);
CREATE INDEX notify_receipt_outcome_received_at ON notify_receipt (outcome, received_at);
CREATE INDEX notify_receipt_out_trade_no ON notify_receipt (out_trade_no);

DROP TABLE payment_anomaly;
