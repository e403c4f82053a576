ALTER TABLE notify_receipt DROP COLUMN route;
