-- Orders have a lifetime (retention.orders_keep_days, src/archive): the archive job finds the
-- final orders created before its window, oldest first, through this index. Built
-- concurrently (outside a transaction: metadata.toml), so payments go on while it builds on a
-- large table; an index an operator built beforehand under this name is kept.
CREATE INDEX CONCURRENTLY IF NOT EXISTS orders_created_at ON orders (created_at);
