DROP TABLE bill_run;
DROP TABLE bill_line;
DROP TABLE bill_item;
DROP TABLE bill_report;
