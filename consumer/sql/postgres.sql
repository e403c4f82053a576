-- The inbox of paynotify-consumer (PostgreSQL). One row per message a consumer applied.
CREATE TABLE IF NOT EXISTS processed_message (
    consumer     VARCHAR(100) NOT NULL,
    message_id   VARCHAR(300) NOT NULL,
    -- The handler's result as JSON; NULL for a `()` result.
    result       TEXT,
    processed_at TIMESTAMP NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS processed_message_purge ON processed_message (consumer, processed_at);
