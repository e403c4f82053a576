DROP INDEX orders_combine_out_trade_no;
ALTER TABLE orders DROP COLUMN combine_out_trade_no;
DROP TABLE combined_order;
