ALTER TABLE orders ADD COLUMN wechat_mchid VARCHAR(32);
ALTER TABLE orders ADD COLUMN alipay_app_id VARCHAR(32);
UPDATE orders SET wechat_mchid = (SELECT account FROM order_account a
    WHERE a.order_no = orders.order_no AND a.channel = 'wechat');
UPDATE orders SET alipay_app_id = (SELECT account FROM order_account a
    WHERE a.order_no = orders.order_no AND a.channel = 'alipay');
DROP TABLE order_account;
