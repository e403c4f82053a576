-- The ledger's first-delivery transaction as raw SQL, for pgbench: callback row, order
-- compare-and-set, outbox row; five round trips, as in paynotify. Each transaction takes a
-- fresh order from bench_seq inside the first insert.
BEGIN;
INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
  VALUES ('B' || nextval('bench_seq'), 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', now())
  ON CONFLICT (out_trade_no, channel) DO NOTHING
  RETURNING out_trade_no AS no \gset
UPDATE orders SET status = 'PAID', channel = 'wechat', transaction_id = 'T', paid_at = now()
  WHERE order_no = :no AND status = 'WAIT_PAY' AND amount_fen = 100 AND currency = 'CNY';
INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at)
  VALUES ('ORDER_PAID', :no, '{"order_no":"B","channel":"wechat","transaction_id":"T","amount_fen":100,"currency":"CNY"}', 0, 0, now(), now());
COMMIT;
