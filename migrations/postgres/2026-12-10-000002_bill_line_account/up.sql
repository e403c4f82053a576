-- The bill rows a run compares are keyed by the account whose bill listed them too: one
-- order paid twice, through two merchants of a channel, is a row in each merchant's bill.
-- The table holds only the rows of runs going on (each run empties its own), so it is made
-- again rather than altered.
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
    PRIMARY KEY (bill_date, channel, account, kind, out_trade_no, out_refund_no)
);
-- The ledger's side finds its rows in every account's bill of the day.
CREATE INDEX bill_line_key ON bill_line (bill_date, channel, kind, out_trade_no, out_refund_no);
