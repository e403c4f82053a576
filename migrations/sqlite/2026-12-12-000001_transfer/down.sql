DROP TABLE transfer_anomaly;
DROP TABLE transfer_account;
DROP TABLE transfer;
