-- The inbox of paynotify-consumer (MySQL / MariaDB, InnoDB). One row per message a consumer applied.
CREATE TABLE IF NOT EXISTS processed_message (
    consumer     VARCHAR(100) NOT NULL,
    message_id   VARCHAR(300) NOT NULL,
    -- The handler's result as JSON; NULL for a `()` result.
    result       LONGTEXT,
    processed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX processed_message_purge (consumer, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
