-- The ledger's first-delivery rows as ONE statement, for pgbench: the service's PostgreSQL
-- payment statement (`PayFirst`, src/store/statements.rs) with literal values: the order
-- locked, callback row, order compare-and-set and outbox row in a single data-modifying CTE
-- (autocommit: one round trip), answering what the service reads back. Each transaction
-- takes a fresh order from bench_seq (the `n` CTE, the one addition). Keep it in step with
-- `PayFirst`.
WITH n AS (SELECT 'B' || nextval('bench_seq') AS no),
target AS (SELECT order_no FROM orders WHERE order_no = (SELECT no FROM n)
  AND status = 'WAIT_PAY' AND amount_fen = 100 AND currency = 'CNY' FOR UPDATE),
cb AS (INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
  SELECT order_no, 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', now()
  FROM target ON CONFLICT (out_trade_no, channel) DO NOTHING RETURNING out_trade_no),
paid AS (UPDATE orders SET status = 'PAID', channel = 'wechat', transaction_id = 'T', paid_at = now()
  WHERE order_no IN (SELECT out_trade_no FROM cb) AND status = 'WAIT_PAY' RETURNING order_no),
message AS (INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at)
  SELECT 'ORDER_PAID', order_no, '{"order_no":"B","channel":"wechat","transaction_id":"T","amount_fen":100,"currency":"CNY"}', 0, 0, now(), now()
  FROM paid RETURNING 1)
SELECT (SELECT count(*) FROM message),
  (SELECT digest FROM pay_callback WHERE out_trade_no = (SELECT no FROM n) AND channel = 'wechat'),
  CAST(CASE WHEN (SELECT count(*) FROM cb) = (SELECT count(*) FROM message) THEN '0'
    ELSE 'paynotify: a callback row without its order change, undone: ' || (SELECT count(*) FROM cb) END AS bigint);
