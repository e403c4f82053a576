DROP TABLE merchant_account;
