-- Asking the providers about unpaid orders (src/reconcile.rs): the WeChat merchant and Alipay
-- app an order is paid through when the caller named them, when the order may next be asked
-- about (or closed at the provider), and how many closes at the provider failed. The reconcile
-- job reads unpaid orders oldest first.
ALTER TABLE orders
    ADD COLUMN wechat_mchid   VARCHAR(32),
    ADD COLUMN alipay_app_id  VARCHAR(32),
    ADD COLUMN next_query_at  DATETIME(6),
    ADD COLUMN close_attempts INTEGER NOT NULL DEFAULT 0,
    ADD INDEX orders_status_created_at (status, created_at);
