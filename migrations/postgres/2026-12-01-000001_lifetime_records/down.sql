DROP TABLE status_callback;
ALTER TABLE local_message ALTER COLUMN biz_key TYPE VARCHAR(200);
ALTER TABLE refund_callback ALTER COLUMN refund_id TYPE VARCHAR(128);
