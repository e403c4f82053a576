-- A year of data (docs/design.md, "Partitions"): the outbox and the receipts live in day
-- partitions that the retention job creates ahead and drops whole once past their window.
--
-- Partition names carry their bounds, and the retention job reads them back:
--   <table>_before_YYYYMMDD  everything before that day (the rows there at this migration)
--   <table>_YYYYMMDD         that UTC day
--   <table>_future           the default: rows no day partition covers yet (a clock ahead
--                            of the job); the job moves them into their day when it creates it.
-- A unique key must contain the partition column, so the outbox keeps no (topic, biz_key)
-- key: a payment, refund or close is written once by the order's compare-and-set and its
-- callback row; an anomaly, which has neither, is written once by `payment_anomaly`.

-- Payment anomalies (and bill mismatches), one per key, kept as long as their order: what
-- makes a repeat of an anomalous notification a duplicate once its outbox row is gone.
CREATE TABLE payment_anomaly (
    biz_key    VARCHAR(255) PRIMARY KEY,
    order_no   VARCHAR(64)  NOT NULL,
    payload    JSONB        NOT NULL,
    created_at TIMESTAMPTZ  NOT NULL
);
CREATE INDEX payment_anomaly_order_no ON payment_anomaly (order_no);
INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at)
    SELECT biz_key, COALESCE(payload->>'order_no', ''), payload, created_at
    FROM local_message WHERE topic = 'PAYMENT_ANOMALY';

-- The outbox: the old table becomes the partition of everything before the day after its
-- newest row (an empty table: before 2026-11-29, a day before any release that wrote one),
-- without copying a row; its indexes are rebuilt as the partitioned table's, once.
ALTER TABLE local_message RENAME TO local_message_old;
ALTER TABLE local_message_old DROP CONSTRAINT local_message_topic_biz_key;
ALTER TABLE local_message_old DROP CONSTRAINT local_message_pkey;
DROP INDEX local_message_pending_due;
DROP INDEX local_message_status_created;
DROP INDEX local_message_sent_at;
CREATE TABLE local_message (
    id              BIGINT       NOT NULL DEFAULT nextval('local_message_id_seq'),
    topic           VARCHAR(32)  NOT NULL,
    biz_key         VARCHAR(255) NOT NULL,
    payload         JSONB        NOT NULL,
    status          SMALLINT     NOT NULL DEFAULT 0
                    CONSTRAINT local_message_status_check CHECK (status IN (0, 1, 2)),
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ  NOT NULL,
    locked_by       TEXT,
    locked_until    TIMESTAMPTZ,
    last_error      TEXT,
    created_at      TIMESTAMPTZ  NOT NULL,
    sent_at         TIMESTAMPTZ,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE local_message_id_seq OWNED BY local_message.id;
-- The relay claims due pending rows in this order; a partial index keeps sent rows out of it.
CREATE INDEX local_message_pending_due ON local_message (next_attempt_at, id) WHERE status = 0;
CREATE INDEX local_message_status_created ON local_message (status, created_at);
CREATE TABLE local_message_future PARTITION OF local_message DEFAULT;

-- Receipts, the same way.
ALTER TABLE notify_receipt RENAME TO notify_receipt_old;
ALTER TABLE notify_receipt_old DROP CONSTRAINT notify_receipt_pkey;
DROP INDEX notify_receipt_received_at;
DROP INDEX notify_receipt_outcome_received_at;
DROP INDEX notify_receipt_out_trade_no;
CREATE TABLE notify_receipt (
    id              BIGINT       NOT NULL DEFAULT nextval('notify_receipt_id_seq'),
    channel         VARCHAR(16)  NOT NULL,
    received_at     TIMESTAMPTZ  NOT NULL,
    peer            VARCHAR(64),
    request_id      VARCHAR(64),
    headers         JSONB        NOT NULL,
    body_b64        TEXT         NOT NULL,
    body_bytes      INTEGER      NOT NULL,
    status          SMALLINT     NOT NULL,
    outcome         VARCHAR(32)  NOT NULL,
    detail          TEXT,
    out_trade_no    VARCHAR(64),
    reapplied_at    TIMESTAMPTZ,
    reapply_outcome VARCHAR(32),
    route           VARCHAR(128),
    PRIMARY KEY (id, received_at)
) PARTITION BY RANGE (received_at);
ALTER SEQUENCE notify_receipt_id_seq OWNED BY notify_receipt.id;
CREATE INDEX notify_receipt_received_at ON notify_receipt (received_at);
CREATE INDEX notify_receipt_outcome_received_at ON notify_receipt (outcome, received_at);
CREATE INDEX notify_receipt_out_trade_no ON notify_receipt (out_trade_no);
CREATE TABLE notify_receipt_future PARTITION OF notify_receipt DEFAULT;

DO $$
DECLARE
    bound date;
BEGIN
    SELECT COALESCE((SELECT (max(created_at) AT TIME ZONE 'UTC')::date + 1 FROM local_message_old),
                    DATE '2026-11-29')
        INTO bound;
    EXECUTE format('ALTER TABLE local_message_old RENAME TO %I',
                   'local_message_before_' || to_char(bound, 'YYYYMMDD'));
    EXECUTE format('ALTER TABLE local_message ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                   'local_message_before_' || to_char(bound, 'YYYYMMDD'), bound::text || ' 00:00:00+00');
    SELECT COALESCE((SELECT (max(received_at) AT TIME ZONE 'UTC')::date + 1 FROM notify_receipt_old),
                    DATE '2026-11-29')
        INTO bound;
    EXECUTE format('ALTER TABLE notify_receipt_old RENAME TO %I',
                   'notify_receipt_before_' || to_char(bound, 'YYYYMMDD'));
    EXECUTE format('ALTER TABLE notify_receipt ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                   'notify_receipt_before_' || to_char(bound, 'YYYYMMDD'), bound::text || ' 00:00:00+00');
END
$$;
