DROP INDEX IF EXISTS orders_created_at;
