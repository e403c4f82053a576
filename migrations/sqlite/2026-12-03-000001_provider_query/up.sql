-- Asking the providers about unpaid orders (src/reconcile.rs): the WeChat merchant and Alipay
-- app an order is paid through when the caller named them, when the order may next be asked
-- about (or closed at the provider), and how many closes at the provider failed.
ALTER TABLE orders ADD COLUMN wechat_mchid VARCHAR(32);
ALTER TABLE orders ADD COLUMN alipay_app_id VARCHAR(32);
ALTER TABLE orders ADD COLUMN next_query_at TEXT;
ALTER TABLE orders ADD COLUMN close_attempts INTEGER NOT NULL DEFAULT 0;
-- The reconcile job reads only unpaid orders, oldest first.
CREATE INDEX orders_wait_pay_created_at ON orders (created_at) WHERE status = 'WAIT_PAY';
