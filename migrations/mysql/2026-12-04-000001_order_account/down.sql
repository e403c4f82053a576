ALTER TABLE orders
    ADD COLUMN wechat_mchid  VARCHAR(32) AFTER expire_at,
    ADD COLUMN alipay_app_id VARCHAR(32) AFTER wechat_mchid;
UPDATE orders o JOIN order_account a ON a.order_no = o.order_no AND a.channel = 'wechat'
    SET o.wechat_mchid = a.account;
UPDATE orders o JOIN order_account a ON a.order_no = o.order_no AND a.channel = 'alipay'
    SET o.alipay_app_id = a.account;
DROP TABLE order_account;
