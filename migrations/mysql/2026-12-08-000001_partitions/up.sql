-- A year of data (docs/design.md, "Partitions"): the outbox and the receipts live in day
-- partitions (RANGE COLUMNS) that the retention job creates ahead and drops whole once past
-- their window. Partition names carry their bounds, and the retention job reads them back:
--   <table>_before_YYYYMMDD  everything before that day (the rows there at this migration)
--   <table>_YYYYMMDD         that UTC day
--   <table>_future           LESS THAN MAXVALUE: rows no day partition covers yet; the job
--                            splits the days off it when it creates them.
-- Every unique key must contain the partition column, so the outbox keeps no
-- (topic, biz_key) key: a payment, refund or close is written once by the order's
-- compare-and-set and its callback row; an anomaly, which has neither, by `payment_anomaly`.

CREATE TABLE payment_anomaly (
    biz_key    VARCHAR(255) NOT NULL PRIMARY KEY,
    order_no   VARCHAR(64)  NOT NULL,
    payload    JSON         NOT NULL,
    created_at DATETIME(6)  NOT NULL,
    INDEX payment_anomaly_order_no (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at)
    SELECT biz_key, COALESCE(JSON_UNQUOTE(JSON_EXTRACT(payload, '$.order_no')), ''), payload, created_at
    FROM local_message WHERE topic = 'PAYMENT_ANOMALY';

-- The rows there stay in the partition of everything before the day after the newest one
-- (an empty table: before 2026-11-29, a day before any release that wrote one).
ALTER TABLE local_message
    DROP INDEX local_message_topic_biz_key,
    DROP INDEX local_message_sent_at,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (id, created_at);
ALTER TABLE notify_receipt
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (id, received_at);

SET @bound = COALESCE((SELECT DATE(MAX(created_at)) + INTERVAL 1 DAY FROM local_message), DATE '2026-11-29');
SET @sql = CONCAT('ALTER TABLE local_message PARTITION BY RANGE COLUMNS (created_at) (',
    'PARTITION local_message_before_', DATE_FORMAT(@bound, '%Y%m%d'), ' VALUES LESS THAN (''', @bound, '''), ',
    'PARTITION local_message_future VALUES LESS THAN (MAXVALUE))');
PREPARE partitioning FROM @sql;
EXECUTE partitioning;
DEALLOCATE PREPARE partitioning;

SET @bound = COALESCE((SELECT DATE(MAX(received_at)) + INTERVAL 1 DAY FROM notify_receipt), DATE '2026-11-29');
SET @sql = CONCAT('ALTER TABLE notify_receipt PARTITION BY RANGE COLUMNS (received_at) (',
    'PARTITION notify_receipt_before_', DATE_FORMAT(@bound, '%Y%m%d'), ' VALUES LESS THAN (''', @bound, '''), ',
    'PARTITION notify_receipt_future VALUES LESS THAN (MAXVALUE))');
PREPARE partitioning FROM @sql;
EXECUTE partitioning;
DEALLOCATE PREPARE partitioning;
