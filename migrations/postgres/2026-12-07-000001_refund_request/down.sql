DROP TABLE refund_request;
