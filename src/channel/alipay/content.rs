//! What Alipay leaves out of a notice's business content: the app of a payment.
//!
//! A trade belongs to the seller whichever of its apps the buyer paid through, and
//! `alipay.trade.query` answers name no app, so a payment recovered through one app is the
//! same content as another app's notification. Payments recorded before this rule named
//! their app: a repeat of such a delivery is still the same content.

use crate::notice::{Digest, Notice, NoticeKind};

/// The app an Alipay notice's content names: none for a payment, its own for the rest.
pub fn app_in_content(notice: &Notice) -> Option<&str> {
    match notice.kind {
        NoticeKind::Paid => None,
        _ => notice.merchant.app_id.as_deref(),
    }
}

/// The digest an Alipay payment was recorded under before its app was left out of the
/// content; `None` for every other notice.
pub fn earlier_digest(notice: &Notice) -> Option<Digest> {
    match (&notice.kind, &notice.merchant.app_id) {
        (NoticeKind::Paid, Some(app_id)) => Some(notice.content_digest(Some(app_id))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::notice::tests::paid;
    use crate::notice::{ChannelId, MerchantIds};

    #[test]
    fn an_alipay_payment_is_the_same_content_through_any_app_of_its_seller() {
        let through = |app: Option<&str>| {
            let mut n = paid();
            n.channel = ChannelId::Alipay;
            n.merchant = MerchantIds {
                merchant_id: "2088000000000001".into(),
                app_id: app.map(str::to_owned),
            };
            n
        };
        let (a, b) = (
            through(Some("2021000000000001")),
            through(Some("2021000000000003")),
        );
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.digest(), through(None).digest());
        // Rows recorded before name the app; a repeat of that delivery is still the same.
        let recorded = a.content_digest(Some("2021000000000001"));
        assert_ne!(recorded, a.digest());
        assert!(a.same_content(&a.digest(), recorded.as_str()));
        assert!(!b.same_content(&b.digest(), recorded.as_str()));
        // The seller still counts, and a WeChat payment's appid does too.
        let mut other_seller = through(Some("2021000000000001"));
        other_seller.merchant.merchant_id.push('9');
        assert_ne!(a.digest(), other_seller.digest());
        let mut wechat = paid();
        wechat.merchant.app_id = Some("wx2".into());
        assert_ne!(paid().digest(), wechat.digest());
    }
}
