-- The trade's running refund total an Alipay refund came with (its notification's, or the
-- refund answer's, refund_fee): which of an order's refunds came before which at Alipay, so a
-- refund known only by its notification is counted at its own amount (src/store/ledger.rs).
-- NULL: not reported (WeChat; an Alipay refund applied from the refund query, until its
-- notification comes). Refunds counted before this column existed are taken as before every
-- later one, as they were counted: 0.
ALTER TABLE refund_callback ADD COLUMN running_total_fen BIGINT;
UPDATE refund_callback SET running_total_fen = 0 WHERE channel = 'alipay';
