DROP TABLE platform_certificate;
