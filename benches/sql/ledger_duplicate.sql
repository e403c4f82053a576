-- The ledger's duplicate path as raw SQL, for pgbench: the insert that conflicts, then the
-- digest read; four round trips, as in paynotify. Any order paid in the first phase.
\set i random(1, :norders)
BEGIN;
INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
  VALUES ('B' || :i, 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', now())
  ON CONFLICT (out_trade_no, channel) DO NOTHING;
SELECT digest FROM pay_callback WHERE out_trade_no = 'B' || :i AND channel = 'wechat';
COMMIT;
