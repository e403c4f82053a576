-- The ledger's first-delivery rows as ONE statement, for pgbench: callback row, order
-- compare-and-set and outbox row in a single data-modifying CTE (autocommit: one round
-- trip). Each transaction takes a fresh order from bench_seq.
WITH cb AS (
  INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
  VALUES ('B' || nextval('bench_seq'), 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', now())
  ON CONFLICT (out_trade_no, channel) DO NOTHING
  RETURNING out_trade_no
), paid AS (
  UPDATE orders SET status = 'PAID', channel = 'wechat', transaction_id = 'T', paid_at = now()
  WHERE order_no = (SELECT out_trade_no FROM cb) AND status = 'WAIT_PAY' AND amount_fen = 100 AND currency = 'CNY'
  RETURNING order_no
)
INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at)
SELECT 'ORDER_PAID', order_no, '{"order_no":"B","channel":"wechat","transaction_id":"T","amount_fen":100,"currency":"CNY"}', 0, 0, now(), now()
FROM paid;
