DROP TABLE bill_line;
CREATE TABLE bill_line (
    bill_date        VARCHAR(10)  NOT NULL,
    channel          VARCHAR(16)  NOT NULL,
    -- payment, refund
    kind             VARCHAR(8)   NOT NULL,
    out_trade_no     VARCHAR(64)  NOT NULL,
    out_refund_no    VARCHAR(64)  NOT NULL,
    account          VARCHAR(64)  NOT NULL,
    transaction_id   VARCHAR(64)  NOT NULL,
    amount_fen       BIGINT       NOT NULL,
    status           VARCHAR(32)  NOT NULL,
    PRIMARY KEY (bill_date, channel, kind, out_trade_no, out_refund_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
