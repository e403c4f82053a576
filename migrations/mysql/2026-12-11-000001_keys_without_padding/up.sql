-- Keys compare byte for byte. utf8mb4_bin is a PAD SPACE collation: 'A-1' and 'A-1 ' are one
-- key to it, so a notification for 'A-1 ' found order 'A-1', and a second order, payment or
-- refund under a number differing only by trailing spaces was a duplicate key. PostgreSQL and
-- SQLite compare trailing spaces already. VARBINARY compares bytes on MySQL 8 and MariaDB
-- alike (their NO PAD collations have different names: utf8mb4_0900_bin, utf8mb4_nopad_bin),
-- and reads as text (the service writes UTF-8 only). A VARCHAR(n) of utf8mb4 holds n
-- characters of up to 4 bytes: VARBINARY(4n) holds the same; the service bounds the lengths.
-- Every column that holds an id from outside (an order, refund, transaction, account,
-- merchant or certificate number, an idempotency key, a business key built from them) and is
-- part of a key or looked up becomes VARBINARY; the channel, status and date columns the
-- service writes itself stay as they are.

ALTER TABLE orders
    MODIFY order_no VARBINARY(256) NOT NULL;

ALTER TABLE order_account
    MODIFY order_no VARBINARY(256) NOT NULL,
    MODIFY account  VARBINARY(256) NOT NULL;

ALTER TABLE pay_callback
    MODIFY out_trade_no VARBINARY(256) NOT NULL;

ALTER TABLE refund_callback
    MODIFY out_refund_no VARBINARY(256) NOT NULL,
    MODIFY out_trade_no  VARBINARY(256) NOT NULL;

ALTER TABLE status_callback
    MODIFY out_trade_no   VARBINARY(256) NOT NULL,
    MODIFY transaction_id VARBINARY(256) NOT NULL,
    MODIFY status         VARBINARY(128) NOT NULL;

ALTER TABLE idempotency_key
    MODIFY idem_key VARBINARY(1020) NOT NULL;

ALTER TABLE payment_anomaly
    MODIFY biz_key  VARBINARY(1020) NOT NULL,
    MODIFY order_no VARBINARY(256)  NOT NULL;

ALTER TABLE refund_request
    MODIFY out_refund_no VARBINARY(256) NOT NULL,
    MODIFY order_no      VARBINARY(256) NOT NULL;

ALTER TABLE platform_certificate
    MODIFY mchid  VARBINARY(256) NOT NULL,
    MODIFY serial VARBINARY(256) NOT NULL;

ALTER TABLE bill_report
    MODIFY account VARBINARY(256) NOT NULL;

ALTER TABLE bill_item
    MODIFY account       VARBINARY(256) NOT NULL,
    MODIFY out_trade_no  VARBINARY(256) NOT NULL,
    MODIFY out_refund_no VARBINARY(256) NOT NULL;

ALTER TABLE bill_line
    MODIFY out_trade_no  VARBINARY(256) NOT NULL,
    MODIFY out_refund_no VARBINARY(256) NOT NULL,
    MODIFY account       VARBINARY(256) NOT NULL;
