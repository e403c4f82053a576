START TRANSACTION;
SET @no = CONCAT('B', NEXTVAL(bench_seq));
INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) VALUES (@no, 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', UTC_TIMESTAMP(6));
UPDATE orders SET status = 'PAID', channel = 'wechat', transaction_id = 'T', paid_at = UTC_TIMESTAMP(6) WHERE order_no = @no AND status = 'WAIT_PAY' AND amount_fen = 100 AND currency = 'CNY';
INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at) VALUES ('ORDER_PAID', @no, '{"order_no":"B","channel":"wechat","transaction_id":"T","amount_fen":100,"currency":"CNY"}', 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));
COMMIT;
