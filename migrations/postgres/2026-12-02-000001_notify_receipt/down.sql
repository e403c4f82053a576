DROP TABLE notify_receipt;
