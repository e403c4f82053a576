ALTER TABLE refund_callback DROP INDEX refund_callback_occurred_at, DROP COLUMN occurred_at;
ALTER TABLE pay_callback DROP INDEX pay_callback_occurred_at, DROP COLUMN occurred_at;
