-- The inbox of paynotify-consumer (MySQL / MariaDB, InnoDB). One row per message a consumer applied.
CREATE TABLE IF NOT EXISTS processed_message (
    consumer     VARCHAR(100) NOT NULL,
    -- Bytes, compared exactly: utf8mb4_bin is a PAD SPACE collation, under which 'X' and
    -- 'X ' are one key, so a second message whose id differs by trailing spaces would be
    -- taken for a duplicate. 300 characters of utf8mb4 are at most 1,200 bytes.
    message_id   VARBINARY(1200) NOT NULL,
    -- The handler's result as JSON; NULL for a `()` result.
    result       LONGTEXT,
    processed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX processed_message_purge (consumer, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
