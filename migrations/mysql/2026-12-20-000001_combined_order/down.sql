DROP INDEX orders_combine_out_trade_no ON orders;
ALTER TABLE orders DROP COLUMN combine_out_trade_no;
DROP TABLE combined_order;
