-- When the provider says a payment or refund happened (WeChat success_time, Alipay
-- gmt_payment / gmt_refund), as the notification or the signed answer carried it: what dates
-- it in the daily bill reconciliation (src/bills), whenever its notification was recorded.
-- NULL when it carried none (then created_at dates it).
ALTER TABLE pay_callback ADD COLUMN occurred_at DATETIME(6) NULL, ADD INDEX pay_callback_occurred_at (occurred_at);
ALTER TABLE refund_callback ADD COLUMN occurred_at DATETIME(6) NULL, ADD INDEX refund_callback_occurred_at (occurred_at);
