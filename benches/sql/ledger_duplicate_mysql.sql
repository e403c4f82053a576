START TRANSACTION;
SET @no = CONCAT('B', NEXTVAL(dup_seq));
INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at) VALUES (@no, 'wechat', 'T', 100, '0000000000000000000000000000000000000000000000000000000000000000', UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE out_trade_no = out_trade_no;
SELECT digest FROM pay_callback WHERE out_trade_no = @no AND channel = 'wechat';
COMMIT;
