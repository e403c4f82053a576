-- Ten first deliveries in ONE statement, for pgbench: the service's PostgreSQL group
-- statement (`PayGroup`, src/store/statements.rs) with literal values, as group apply sends
-- it for a group of ten (one round trip, one commit for the ten). Each transaction takes ten
-- fresh orders from bench_seq (the `input` CTE's one addition). Keep it in step with
-- `PayGroup`.
WITH input AS (SELECT 'B' || nextval('bench_seq') AS out_trade_no, 'wechat' AS channel,
    'T' || g AS transaction_id, 100::bigint AS amount_fen, 'CNY' AS currency,
    '0000000000000000000000000000000000000000000000000000000000000000' AS digest,
    '{"order_no":"B","channel":"wechat","transaction_id":"T","amount_fen":100,"currency":"CNY"}'::jsonb AS payload,
    now() AS now, NULL::timestamptz AS occurred_at, 'default' AS account, g AS position
  FROM generate_series(1, 10) g),
locked AS (SELECT order_no, amount_fen, currency FROM orders
  WHERE order_no = ANY(ARRAY(SELECT out_trade_no FROM input)) AND COALESCE(status, '') = 'WAIT_PAY'
  AND combine_out_trade_no IS NULL ORDER BY order_no FOR UPDATE SKIP LOCKED),
target AS (SELECT l.order_no FROM locked l JOIN input i ON i.out_trade_no = l.order_no
  WHERE l.amount_fen = i.amount_fen AND l.currency = i.currency AND NOT EXISTS (SELECT 1 FROM order_account oa
    WHERE oa.order_no = l.order_no AND oa.channel = i.channel AND oa.account <> i.account)),
cb AS (INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at, occurred_at)
  SELECT i.out_trade_no, i.channel, i.transaction_id, i.amount_fen, i.digest, i.now, i.occurred_at
  FROM input i JOIN target t ON t.order_no = i.out_trade_no
  ON CONFLICT (out_trade_no, channel) DO NOTHING RETURNING out_trade_no),
paid AS (UPDATE orders o SET status = 'PAID', channel = i.channel, transaction_id = i.transaction_id, paid_at = i.now
  FROM input i WHERE o.order_no = ANY(ARRAY(SELECT out_trade_no FROM cb))
  AND i.out_trade_no = o.order_no AND COALESCE(o.status, '') = 'WAIT_PAY' RETURNING o.order_no),
message AS (INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at)
  SELECT 'ORDER_PAID', i.out_trade_no, i.payload, 0, 0, i.now, i.now
  FROM input i JOIN paid p ON p.order_no = i.out_trade_no RETURNING biz_key)
SELECT i.position, i.out_trade_no IN (SELECT biz_key FROM message),
  (SELECT pc.digest FROM pay_callback pc WHERE pc.out_trade_no = i.out_trade_no AND pc.channel = i.channel),
  CAST(CASE WHEN (SELECT count(*) FROM cb) = (SELECT count(*) FROM message) THEN '0'
    ELSE 'paynotify: a callback row without its order change, undone: ' || (SELECT count(*) FROM cb) END AS bigint)
FROM input i;
