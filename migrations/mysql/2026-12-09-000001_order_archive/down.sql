DROP INDEX orders_created_at ON orders;
