ALTER TABLE orders
    DROP INDEX orders_status_created_at,
    DROP COLUMN close_attempts,
    DROP COLUMN next_query_at,
    DROP COLUMN alipay_app_id,
    DROP COLUMN wechat_mchid;
