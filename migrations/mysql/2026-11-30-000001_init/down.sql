DROP TABLE idempotency_key;
DROP TABLE local_message;
DROP TABLE status_callback;
DROP TABLE refund_callback;
DROP TABLE pay_callback;
DROP TABLE orders;
