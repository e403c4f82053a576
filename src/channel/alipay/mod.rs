//! Alipay asynchronous notifications (`/notify/alipay`, `trade_status_sync`) and Open
//! Platform messages to the app gateway (`/notify/alipay/gateway`,
//! `alipay.fund.trans.order.changed`).
//!
//! Alipay: the body is `application/x-www-form-urlencoded` in the charset its own `charset`
//! parameter names. Percent-decode once (`+` is a space), drop `sign` and `sign_type`, sort the
//! rest by key, join `k=v` with `&`, and verify `sign` (base64 SHA256withRSA) over those bytes
//! with the app's Alipay public key. The raw body is read as bytes: actix's form extractor
//! would refuse Alipay's `…; text/html; charset=utf-8` Content-Type, and URL query parameters
//! are never part of the signed set. A gateway message is a form signed the same way
//! (`notify_id`, `utc_timestamp`, `msg_method`, `app_id`, `version`, `charset`, `biz_content`),
//! and each kind is taken only on its own route.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use utoipa::OpenApi;

use super::api::ProviderApi;
use super::keys::{self, RsaVerifier};
#[cfg(feature = "fuzzing")]
use super::{Channel, Rejection};
use super::{Mounted, Provider};
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
#[cfg(feature = "fuzzing")]
use crate::notice::Notice;
use crate::time::Timestamp;
#[cfg(feature = "fuzzing")]
use wire::{Form, read_fields};

mod accounts;
mod api;
pub mod bill;
pub mod cert_sn;
pub mod content;
mod explain;
pub mod settings;
mod trade;
pub mod transfer;
mod verify;
mod wire;

pub use api::{AlipayApi, CertSn, GATEWAY};
pub use settings::{AlipayApp, AlipaySettings};
pub use wire::string_to_sign;

/// The notify route: every kind of trade notification (payments, refunds, closes) comes here.
pub const NOTIFY_ROUTE: &str = "/notify/alipay";

/// The app gateway (应用网关): Open Platform messages, such as a transfer's
/// `alipay.fund.trans.order.changed`, come here. Set it in the Open Platform console.
pub const GATEWAY_ROUTE: &str = "/notify/alipay/gateway";

/// An Alipay app with its own keys.
pub struct App {
    pub app_id: String,
    pub seller_id: String,
    key: RsaVerifier,
}

/// A merchant that authorised an ISV's app (`partner_sub`): its `auth_app_id`.
#[derive(Debug)]
pub struct AuthorizedApp {
    pub auth_app_id: String,
    /// The ISV's app.
    pub isv_app_id: String,
    /// The merchant's PID, checked when set.
    pub seller_id: Option<String>,
}

/// What the channel knows at one moment, swapped whole when an app changes.
#[derive(Clone, Default)]
pub(super) struct Book {
    pub(super) apps: HashMap<String, Arc<App>>,
    pub(super) authorized: HashMap<String, Arc<AuthorizedApp>>,
}

/// The Alipay channel: every app, file and database, keyed by `app_id`.
pub struct Alipay {
    book: RwLock<Arc<Book>>,
    /// The apps of the configuration file, in its order.
    pub(super) file: Vec<String>,
}

impl std::fmt::Debug for Alipay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let book = self.book();
        let mut ids: Vec<_> = book.apps.keys().collect();
        ids.sort();
        f.debug_struct("Alipay").field("apps", &ids).finish()
    }
}

impl Alipay {
    /// What the channel knows now (an `Arc`, never waiting for a change being built).
    pub(super) fn book(&self) -> Arc<Book> {
        Arc::clone(
            &self
                .book
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Builds the next book from the current one and swaps it in.
    pub(super) fn change<T>(&self, edit: impl FnOnce(&mut Book) -> T) -> T {
        let mut book = self
            .book
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = Book::clone(&book);
        let out = edit(&mut next);
        *book = Arc::new(next);
        out
    }

    /// The enabled app `app_id` with its own keys.
    pub fn app(&self, app_id: &str) -> Option<Arc<App>> {
        self.book().apps.get(app_id).cloned()
    }
}

impl Alipay {
    /// Loads every app's Alipay public key once, at start-up.
    pub fn from_settings(settings: &AlipaySettings, now: Timestamp) -> Result<Self, ConfigError> {
        let mut apps = HashMap::new();
        for (i, a) in settings.apps.iter().enumerate() {
            let prefix = format!("alipay.apps[{i}]");
            let key = match (&a.alipay_public_key_file, &a.alipay_cert_file) {
                (Some(path), None) => {
                    keys::public_key_file(&format!("{prefix}.alipay_public_key_file"), path)?
                }
                // Certificate mode: notifications are verified exactly as in public-key mode,
                // with the key inside alipayCertPublicKey_RSA2.crt.
                (None, Some(path)) => {
                    keys::certificate_file(&format!("{prefix}.alipay_cert_file"), path, now)?.1
                }
                _ => {
                    return Err(invalid(
                        prefix,
                        "set exactly one of alipay_public_key_file and alipay_cert_file",
                    ));
                }
            };
            let app = App {
                app_id: a.app_id.clone(),
                seller_id: a.seller_id.clone(),
                key,
            };
            if apps.insert(a.app_id.clone(), Arc::new(app)).is_some() {
                return Err(invalid(
                    format!("{prefix}.app_id"),
                    format!("{} is configured twice", a.app_id),
                ));
            }
        }
        let mut file: Vec<String> = settings.apps.iter().map(|a| a.app_id.clone()).collect();
        file.dedup();
        Ok(Self {
            book: RwLock::new(Arc::new(Book {
                apps,
                authorized: HashMap::new(),
            })),
            file,
        })
    }
}

#[cfg(feature = "fuzzing")]
impl Alipay {
    /// Fuzzing only (the `fuzzing` feature, never in the service): [`Channel::admit`]'s
    /// steps after the signature check, for a form as if its `sign` verified.
    pub fn admit_signed_body(&self, body: &[u8]) -> Result<Notice, Rejection> {
        let form = Form::parse(body)?;
        let app = form
            .get("app_id")
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| self.app(id))
            .ok_or_else(|| Rejection::BadSignature("unknown app_id".into()))?;
        let kind = wire::Kind::of_form(&form);
        read_fields(&app, kind, form)
            .and_then(|v| self.decode(v))
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
    }
}

// The OpenAPI text of `NOTIFY_ROUTE` (served by the HTTP room's one notify handler); a
// line comment, since utoipa would publish a doc comment as the summary.
#[utoipa::path(post, path = "/notify/alipay", tag = "notify",
    description = "Alipay asynchronous notification (trade_status_sync): payments, refunds, closes. Authenticated by the RSA2 `sign` field; the body is read raw whatever its Content-Type.",
    request_body(content = String, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "`success`: applied, duplicate, recorded anomaly", content_type = "text/plain", body = String),
        (status = 400, description = "`fail`: malformed form, repeated field, bad amount", content_type = "text/plain", body = String),
        (status = 401, description = "`fail`: bad or missing sign, unknown app_id", content_type = "text/plain", body = String),
        (status = 404, description = "`fail`: unknown order", content_type = "text/plain", body = String),
        (status = 409, description = "`fail`: the same payment or refund as before with other amount or merchant", content_type = "text/plain", body = String),
        (status = 413, description = "`fail`: body too large", content_type = "text/plain", body = String),
        (status = 503, description = "`fail`: database unavailable or the same notification in flight", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn alipay() {}

// The OpenAPI text of `GATEWAY_ROUTE`, as above.
#[utoipa::path(post, path = "/notify/alipay/gateway", tag = "notify",
    description = "Alipay Open Platform messages to the app gateway (应用网关): `alipay.fund.trans.order.changed` moves a merchant transfer; any other verified `msg_method` is acknowledged with `success`, logged, and nothing is applied. Verified exactly like `/notify/alipay` (RSA2 `sign` over the sorted fields but `sign` and `sign_type`; `app_id` picks the app and its Alipay key); `utc_timestamp` is not checked for freshness, as `notify_time` is not. A trade notification posted here is refused (`wrong_event_type`), as a message posted to `/notify/alipay` is.",
    request_body(content = String, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "`success`: applied, duplicate, recorded TRANSFER_ANOMALY (an unknown out_biz_no, another amount or app), or a msg_method not acted on", content_type = "text/plain", body = String),
        (status = 400, description = "`fail`: malformed form or biz_content, repeated field, bad amount, a trade notification (wrong_event_type)", content_type = "text/plain", body = String),
        (status = 401, description = "`fail`: bad or missing sign, unknown app_id", content_type = "text/plain", body = String),
        (status = 413, description = "`fail`: body too large", content_type = "text/plain", body = String),
        (status = 503, description = "`fail`: database unavailable", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn alipay_gateway() {}

/// The OpenAPI description of the notify routes.
#[derive(OpenApi)]
#[openapi(paths(alipay, alipay_gateway))]
pub struct NotifyApi;

/// Loads the apps' keys (once, at start-up) and mounts the notify route and the app gateway;
/// with API credentials, the API client asks about trades and transfers, sends transfers
/// and fetches the daily bills.
pub fn mount(
    settings: &AlipaySettings,
    client: &ClientSettings,
    now: Timestamp,
) -> Result<Mounted, ConfigError> {
    let built = Arc::new(Alipay::from_settings(settings, now)?);
    let provider: Arc<dyn Provider> = built.clone();
    let client = Arc::new(AlipayApi::from_settings(&built, settings, client, now)?);
    let api: Arc<dyn ProviderApi> = client.clone();
    let bills: Arc<dyn super::bill::BillSource> = client.clone();
    let accounts = Arc::new(accounts::AlipayBook {
        channel: Arc::clone(&built),
        api: client,
    });
    let routes = vec![
        super::NotifyRoute {
            path: NOTIFY_ROUTE,
            channel: built.clone(),
        },
        super::NotifyRoute {
            path: GATEWAY_ROUTE,
            channel: built,
        },
    ];
    Ok(Mounted {
        routes,
        provider,
        api: Some(api),
        keys: None,
        bills: Some(bills),
        accounts,
    })
}

#[cfg(test)]
mod tests {
    use super::api::{ApiResponse, beijing, beijing_time, signed_response};
    use super::trade::{refund_biz, refund_reply};
    use super::*;
    use crate::channel::api::{Failure, RefundCall, RefundReply, RefundState};
    use crate::notice::{NoticeKind, Refund, RefundAmount};
    use chrono::TimeZone;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    use rsa::{Generate, PrivateKey};

    const KEY: &str = "alipay_trade_query_response";

    fn key_pair() -> (PrivateKey, RsaVerifier) {
        let key = PrivateKey::try_generate().expect("key");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("alipay.pem");
        let pem = key
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem");
        std::fs::write(&path, pem).expect("write");
        let verifier = keys::public_key_file("test", &path).expect("public key");
        (key, verifier)
    }

    #[test]
    fn an_answer_is_verified_over_the_exact_bytes_of_its_response_value() {
        let (key, verifier) = key_pair();
        // Alipay's own spacing and escapes: re-serialising the parsed value changes them.
        let value =
            "{\"code\": \"10000\",\"msg\":\"Success\",\"subject\":\"\\u6c99\\u7bb1 a\\/b\"}";
        let sign = crate::qa::forge::rsa_sign(&key, value.as_bytes()).expect("sign");
        let body = format!("{{\"{KEY}\":{value},\"sign\":\"{sign}\"}}");
        assert_eq!(signed_response(&verifier, body.as_bytes(), KEY), Ok(value));

        let parsed: serde_json::Value = serde_json::from_str(value).expect("json");
        let reserialised = format!("{{\"{KEY}\":{parsed},\"sign\":\"{sign}\"}}");
        assert!(matches!(
            signed_response(&verifier, reserialised.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
        let unsigned = format!("{{\"{KEY}\":{value}}}");
        assert!(matches!(
            signed_response(&verifier, unsigned.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
        // Alipay's answer to an unknown app_id: unsigned, never evidence.
        let unknown_app =
            "{\"error_response\":{\"code\":\"40002\",\"sub_code\":\"isv.invalid-app-id\"}}";
        assert!(matches!(
            signed_response(&verifier, unknown_app.as_bytes(), KEY),
            Err(Failure::BadSignature(_))
        ));
    }

    #[test]
    fn request_timestamps_are_beijing_time() {
        let at = chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 16, 30, 5)
            .single()
            .expect("time");
        assert_eq!(beijing(Timestamp::new(at)), "2026-12-01 00:30:05");
    }

    fn call() -> RefundCall {
        RefundCall {
            out_trade_no: "O1".into(),
            transaction_id: "2026O1".into(),
            out_refund_no: "R1".into(),
            amount_fen: 3000,
            total_fen: 10000,
            reason: None,
        }
    }

    fn app() -> App {
        App {
            app_id: "2021000000000001".into(),
            seller_id: "2088000000000001".into(),
            key: key_pair().1,
        }
    }

    fn answer(value: serde_json::Value) -> ApiResponse {
        serde_json::from_value(value).expect("answer")
    }

    #[test]
    fn a_refund_names_the_payment_in_yuan_and_omits_an_absent_reason() {
        let mut call = call();
        assert_eq!(
            refund_biz(&call),
            serde_json::json!({
                "out_trade_no": "O1",
                "trade_no": "2026O1",
                "refund_amount": "30.00",
                "out_request_no": "R1"
            })
        );
        call.reason = Some("退货".into());
        assert_eq!(refund_biz(&call)["refund_reason"], "退货");
    }

    #[test]
    fn a_refund_answered_with_money_moved_carries_its_notification_s_notice() {
        let app = app();
        let done = serde_json::json!({
            "code": "10000", "msg": "Success", "out_trade_no": "O1", "trade_no": "2026O1",
            "buyer_logon_id": "159****3821", "fund_change": "Y", "refund_fee": "50.00",
            "gmt_refund_pay": "2026-11-30 11:00:00"
        });
        let Ok(RefundReply::Accepted {
            state: RefundState::Success,
            refund_id: Some(refund_id),
            notice: Some(notice),
        }) = refund_reply(&app, &call(), answer(done.clone()))
        else {
            panic!("accepted, done, with its notice");
        };
        assert_eq!(refund_id, "2026O1:R1");
        assert_eq!(
            notice.kind,
            NoticeKind::Refunded(Refund {
                out_refund_no: "R1".into(),
                refund_id: "2026O1:R1".into(),
                amount: RefundAmount::RunningTotal(5000),
            })
        );
        assert_eq!(notice.merchant.merchant_id, app.seller_id);
        assert_eq!(notice.merchant.app_id.as_deref(), Some(app.app_id.as_str()));
        assert!(notice.merchant_matches);
        assert_eq!(notice.occurred_at, beijing_time("2026-11-30 11:00:00"));

        let mut not_yet = done.clone();
        not_yet["fund_change"] = "N".into();
        let mut absent = done.clone();
        absent
            .as_object_mut()
            .expect("object")
            .remove("fund_change");
        for value in [not_yet, absent] {
            assert_eq!(
                refund_reply(&app, &call(), answer(value)),
                Ok(RefundReply::Accepted {
                    state: RefundState::Processing,
                    refund_id: Some("2026O1:R1".into()),
                    notice: None,
                })
            );
        }
        // Money moved, but no running total to key the notice on.
        let mut no_fee = done.clone();
        no_fee.as_object_mut().expect("object").remove("refund_fee");
        assert!(matches!(
            refund_reply(&app, &call(), answer(no_fee)),
            Err(Failure::Unexpected(_))
        ));
        // A signed answer about another trade or refund says nothing about this one.
        for (key, other) in [
            ("out_trade_no", "O2"),
            ("trade_no", "2026O2"),
            ("out_request_no", "R2"),
        ] {
            let mut value = done.clone();
            value[key] = other.into();
            assert!(
                matches!(
                    refund_reply(&app, &call(), answer(value)),
                    Err(Failure::Unexpected(_))
                ),
                "{key}"
            );
        }
        let mut unnamed = done;
        unnamed
            .as_object_mut()
            .expect("object")
            .remove("out_trade_no");
        assert!(matches!(
            refund_reply(&app, &call(), answer(unnamed)),
            Err(Failure::Unexpected(_))
        ));
    }

    #[test]
    fn a_refund_error_is_a_refusal_unless_alipay_says_try_later() {
        let app = app();
        let error = |code: &str, sub_code: &str| {
            answer(serde_json::json!({
                "code": code, "msg": "Business Failed", "sub_code": sub_code, "sub_msg": "说明"
            }))
        };
        for sub_code in [
            "ACQ.SELLER_BALANCE_NOT_ENOUGH",
            "ACQ.TRADE_NOT_ALLOW_REFUND",
            "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL",
            "ACQ.TRADE_NOT_EXIST",
        ] {
            assert_eq!(
                refund_reply(&app, &call(), error("40004", sub_code)),
                Ok(RefundReply::Refused {
                    code: sub_code.into(),
                    message: "说明".into()
                })
            );
        }
        assert_eq!(
            refund_reply(
                &app,
                &call(),
                answer(serde_json::json!({"code": "40002", "msg": "Invalid Arguments"}))
            ),
            Ok(RefundReply::Refused {
                code: "40002".into(),
                message: "Invalid Arguments".into()
            })
        );
        for (code, sub_code) in [("40004", "ACQ.SYSTEM_ERROR"), ("20000", "isp.unknow-error")] {
            assert!(
                matches!(
                    refund_reply(&app, &call(), error(code, sub_code)),
                    Ok(RefundReply::Failed(Failure::Unreachable(_)))
                ),
                "{code} {sub_code}"
            );
        }
    }

    #[test]
    fn answer_times_are_beijing_time_with_or_without_fractions() {
        let at = chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 3, 0, 0)
            .single()
            .expect("time");
        assert_eq!(
            beijing_time("2026-11-30 11:00:00"),
            Some(Timestamp::new(at))
        );
        assert_eq!(
            beijing_time("2026-11-30 11:00:00.123"),
            Some(Timestamp::new(at + chrono::Duration::milliseconds(123)))
        );
        assert_eq!(beijing_time("2026-11-30T11:00:00"), None);
    }

    /// The channel with one app, and Alipay's side of it.
    fn one_app() -> (Alipay, crate::qa::forge::alipay::Sandbox) {
        let (private_key, key) = key_pair();
        let app = App {
            app_id: "2021000000000002".into(),
            seller_id: "2088000000000002".into(),
            key,
        };
        let sandbox = crate::qa::forge::alipay::Sandbox {
            app_id: app.app_id.clone(),
            seller_id: app.seller_id.clone(),
            private_key,
        };
        let apps = HashMap::from([(app.app_id.clone(), Arc::new(app))]);
        let book = Book {
            apps,
            authorized: HashMap::new(),
        };
        let alipay = Alipay {
            book: RwLock::new(Arc::new(book)),
            file: Vec::new(),
        };
        (alipay, sandbox)
    }

    fn admitted(
        alipay: &Alipay,
        body: &[u8],
        route: Option<&str>,
    ) -> Result<crate::notice::Notice, crate::channel::Rejection> {
        let headers = actix_web::http::header::HeaderMap::new();
        let request = crate::channel::Inbound {
            headers: &headers,
            body,
            now: Timestamp::new(chrono::Utc::now()),
            route,
        };
        Provider::admit(alipay, &request)
    }

    #[test]
    fn a_transfer_message_is_the_transfer_it_names_as_its_app_s() {
        use crate::qa::forge::alipay::{FundOrder, transfer_changed};
        use crate::transfer::TransferState;

        let (alipay, sandbox) = one_app();
        let order = FundOrder {
            out_biz_no: "T1".into(),
            order_id: "20261130110070000002".into(),
            amount_fen: 12345,
            status: "SUCCESS".into(),
            error_code: None,
        };
        let message = sandbox
            .notification(transfer_changed(&sandbox, &order), false)
            .expect("forge");
        let notice = admitted(&alipay, &message.body, Some(GATEWAY_ROUTE)).expect("admitted");
        let NoticeKind::Transfer(seen) = &notice.kind else {
            panic!("a transfer: {notice:?}");
        };
        assert_eq!(seen.out_bill_no, "T1");
        assert_eq!(
            seen.provider_bill_no.as_deref(),
            Some("20261130110070000002")
        );
        assert_eq!(seen.state, TransferState::Success);
        assert_eq!(seen.provider_state.as_deref(), Some("SUCCESS"));
        assert_eq!(seen.amount_fen, Some(12345));
        assert_eq!(seen.account, sandbox.app_id);
        assert_eq!(seen.occurred_at, beijing_time("2026-11-30 11:00:01"));
        assert_eq!(notice.out_trade_no, "T1");
        assert_eq!(notice.transaction_id, "20261130110070000002");
        assert_eq!(notice.amount_fen, 12345);
        assert_eq!(notice.merchant.merchant_id, sandbox.app_id);
        assert_eq!(
            notice.merchant.app_id.as_deref(),
            Some(sandbox.app_id.as_str())
        );
        assert!(notice.merchant_matches);

        let failed = FundOrder {
            status: "FAIL".into(),
            error_code: Some("PAYEE_ACCOUNT_STATUS_ERROR".into()),
            ..order
        };
        let message = sandbox
            .notification(transfer_changed(&sandbox, &failed), false)
            .expect("forge");
        let notice = admitted(&alipay, &message.body, Some(GATEWAY_ROUTE)).expect("admitted");
        let NoticeKind::Transfer(seen) = &notice.kind else {
            panic!("a transfer: {notice:?}");
        };
        assert_eq!(seen.state, TransferState::Fail);
        assert_eq!(
            seen.fail_reason.as_deref(),
            Some("PAYEE_ACCOUNT_STATUS_ERROR")
        );
    }

    #[test]
    fn each_kind_of_form_is_taken_on_its_own_route_only() {
        use crate::channel::Rejection;
        use crate::qa::forge::alipay::{gateway_message, payment};

        let (alipay, sandbox) = one_app();
        let other = sandbox
            .notification(
                gateway_message(
                    &sandbox,
                    "alipay.open.app.notify.test",
                    &serde_json::json!({"x": 1}),
                ),
                false,
            )
            .expect("forge");
        let trade = sandbox
            .notification(
                payment(&sandbox, "O1", "2026O1", 100, "TRADE_SUCCESS"),
                false,
            )
            .expect("forge");
        let notice = admitted(&alipay, &other.body, Some(GATEWAY_ROUTE)).expect("admitted");
        assert_eq!(
            notice.kind,
            NoticeKind::Other {
                status: "alipay.open.app.notify.test".into()
            }
        );
        assert_eq!(notice.out_trade_no, "");
        assert!(matches!(
            admitted(&alipay, &trade.body, Some(GATEWAY_ROUTE)),
            Err(Rejection::WrongEventType(_))
        ));
        assert!(matches!(
            admitted(&alipay, &other.body, Some(NOTIFY_ROUTE)),
            Err(Rejection::WrongEventType(_))
        ));
        assert_eq!(
            admitted(&alipay, &trade.body, Some(NOTIFY_ROUTE)).map(|n| n.kind),
            Ok(NoticeKind::Paid)
        );
        // A receipt stored before routes were kept: either kind is taken.
        assert!(admitted(&alipay, &trade.body, None).is_ok());
        assert!(admitted(&alipay, &other.body, None).is_ok());
        // A message that does not verify is refused before its kind is looked at.
        let mut forged = sandbox
            .notification(
                gateway_message(
                    &sandbox,
                    "alipay.open.app.notify.test",
                    &serde_json::json!({}),
                ),
                false,
            )
            .expect("forge");
        forged.body.extend_from_slice(b"&extra=1");
        assert!(matches!(
            admitted(&alipay, &forged.body, Some(NOTIFY_ROUTE)),
            Err(Rejection::BadSignature(_))
        ));
    }
}
