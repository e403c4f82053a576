-- The inbox of paynotify-consumer (SQLite). One row per message a consumer applied.
CREATE TABLE IF NOT EXISTS processed_message (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    -- The handler's result as JSON; NULL for a `()` result.
    result       TEXT,
    processed_at TIMESTAMP NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS processed_message_purge ON processed_message (consumer, processed_at);
