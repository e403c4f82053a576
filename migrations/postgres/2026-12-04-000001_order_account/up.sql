-- The provider account an order is paid through, one row per channel the caller named (an
-- order may be payable by WeChat and Alipay at once): a new provider needs no column of its
-- own. `channel` is the value stored in `orders.channel`; `account` the WeChat `mchid`, the
-- Alipay `app_id`, …. Written with the order, in its transaction, and never changed.
CREATE TABLE order_account (
    order_no VARCHAR(64) NOT NULL,
    channel  VARCHAR(16) NOT NULL,
    account  VARCHAR(64) NOT NULL,
    PRIMARY KEY (order_no, channel)
);

INSERT INTO order_account (order_no, channel, account)
    SELECT order_no, 'wechat', wechat_mchid FROM orders WHERE wechat_mchid IS NOT NULL;
INSERT INTO order_account (order_no, channel, account)
    SELECT order_no, 'alipay', alipay_app_id FROM orders WHERE alipay_app_id IS NOT NULL;

ALTER TABLE orders DROP COLUMN wechat_mchid;
ALTER TABLE orders DROP COLUMN alipay_app_id;
