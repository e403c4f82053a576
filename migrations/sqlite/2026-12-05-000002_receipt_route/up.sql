-- The notify route a receipt's request came to (/notify/wechat/refund): a re-apply and
-- `paynotify explain` check its event type against the route, as the notify handler did.
-- NULL for a receipt stored before routes were kept (every event type of its channel taken).
ALTER TABLE notify_receipt ADD COLUMN route VARCHAR(128);
