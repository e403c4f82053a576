DROP INDEX orders_wait_pay_created_at;
ALTER TABLE orders DROP COLUMN close_attempts;
ALTER TABLE orders DROP COLUMN next_query_at;
ALTER TABLE orders DROP COLUMN alipay_app_id;
ALTER TABLE orders DROP COLUMN wechat_mchid;
