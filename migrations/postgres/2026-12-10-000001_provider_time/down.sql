DROP INDEX refund_callback_occurred_at;
DROP INDEX pay_callback_occurred_at;
ALTER TABLE refund_callback DROP COLUMN occurred_at;
ALTER TABLE pay_callback DROP COLUMN occurred_at;
