DROP TABLE status_callback;
