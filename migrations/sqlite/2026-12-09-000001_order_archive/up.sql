-- Orders have a lifetime (retention.orders_keep_days, src/archive): the archive job finds the
-- final orders created before its window, oldest first, through this index.
CREATE INDEX orders_created_at ON orders (created_at);
