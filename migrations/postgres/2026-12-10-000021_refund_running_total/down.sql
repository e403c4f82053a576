ALTER TABLE refund_callback DROP COLUMN running_total_fen;
