-- Combined payments (合单支付): one buyer payment for up to 50 sub-orders. The combination
-- is written with its sub-orders, in one transaction (POST /combined-orders); each sub-order
-- is an ordinary row of `orders` that names its combination. Ids from outside are VARBINARY,
-- compared byte for byte (2026-12-11-000001_keys_without_padding).
CREATE TABLE combined_order (
    -- WeChat's combine_out_trade_no, Alipay's out_merge_no.
    combine_out_trade_no VARBINARY(128) NOT NULL PRIMARY KEY,
    channel              VARCHAR(16)    NOT NULL,
    -- The merchant that starts the combined payment (WeChat combine_mchid, the Alipay app).
    account              VARBINARY(256) NOT NULL,
    amount_fen           BIGINT         NOT NULL CHECK (amount_fen > 0),
    sub_order_count      INTEGER        NOT NULL CHECK (sub_order_count BETWEEN 1 AND 50),
    -- The sub-orders' order_no, as a JSON array in the order of the request.
    sub_orders           MEDIUMTEXT     NOT NULL,
    -- SHA-256 of the request as parsed: a repeat with the same body is answered 200.
    request_digest       CHAR(64)       NOT NULL,
    created_at           DATETIME(6)    NOT NULL,
    expire_at            DATETIME(6)    NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

ALTER TABLE orders ADD COLUMN combine_out_trade_no VARBINARY(128) NULL;
CREATE INDEX orders_combine_out_trade_no ON orders (combine_out_trade_no);
