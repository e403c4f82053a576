-- The inbox of paynotify-consumer (MySQL / MariaDB, InnoDB). One row per message a consumer applied.
CREATE TABLE IF NOT EXISTS processed_message (
    -- Both key columns are bytes, compared exactly: utf8mb4_bin is a PAD SPACE collation,
    -- under which 'X' and 'X ' are one key, so a second message whose id differs by trailing
    -- spaces would be taken for a duplicate. 100 and 300 characters of utf8mb4 are at most
    -- 400 and 1,200 bytes.
    consumer     VARBINARY(400) NOT NULL,
    message_id   VARBINARY(1200) NOT NULL,
    -- The handler's result as JSON; NULL for a `()` result.
    result       LONGTEXT,
    processed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX processed_message_purge (consumer, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
