//! The tables, one definition for every backend (see `types` for the two custom SQL types).

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    orders (order_no) {
        order_no -> Text,
        status -> Text,
        amount_fen -> BigInt,
        refunded_fen -> BigInt,
        currency -> Text,
        subject -> Text,
        channel -> Nullable<Text>,
        transaction_id -> Nullable<Text>,
        created_at -> UtcTs,
        paid_at -> Nullable<UtcTs>,
        closed_at -> Nullable<UtcTs>,
        expire_at -> UtcTs,
        next_query_at -> Nullable<UtcTs>,
        close_attempts -> Integer,
        /// The combination a sub-order belongs to (`combined_order`); `NULL` for an
        /// ordinary order.
        combine_out_trade_no -> Nullable<Text>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// A combined payment (合单支付) and its sub-orders' numbers (src/combined/).
    combined_order (combine_out_trade_no) {
        combine_out_trade_no -> Text,
        channel -> Text,
        account -> Text,
        amount_fen -> BigInt,
        sub_order_count -> Integer,
        /// The sub-orders' `order_no`, a JSON array in the order of the request.
        sub_orders -> Text,
        request_digest -> Text,
        created_at -> UtcTs,
        expire_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;

    /// The provider account an order names per channel (`POST /orders`); none: every
    /// account with API credentials is asked about it.
    order_account (order_no, channel) {
        order_no -> Text,
        channel -> Text,
        account -> Text,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    pay_callback (out_trade_no, channel) {
        out_trade_no -> Text,
        channel -> Text,
        transaction_id -> Text,
        amount_fen -> BigInt,
        digest -> Text,
        created_at -> UtcTs,
        /// When the provider says it was paid (WeChat `success_time`, Alipay `gmt_payment`).
        occurred_at -> Nullable<UtcTs>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    refund_callback (out_refund_no, channel, out_trade_no) {
        out_refund_no -> Text,
        channel -> Text,
        out_trade_no -> Text,
        refund_id -> Text,
        refund_fen -> BigInt,
        status -> Text,
        digest -> Text,
        created_at -> UtcTs,
        /// When the provider says it was refunded (WeChat `success_time`, Alipay `gmt_refund`).
        occurred_at -> Nullable<UtcTs>,
        running_total_fen -> Nullable<BigInt>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    status_callback (out_trade_no, channel, transaction_id, status) {
        out_trade_no -> Text,
        channel -> Text,
        transaction_id -> Text,
        status -> Text,
        amount_fen -> BigInt,
        created_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::{Json, UtcTs};

    local_message (id) {
        id -> BigInt,
        topic -> Text,
        biz_key -> Text,
        payload -> Json,
        status -> SmallInt,
        attempts -> Integer,
        next_attempt_at -> UtcTs,
        locked_by -> Nullable<Text>,
        locked_until -> Nullable<UtcTs>,
        last_error -> Nullable<Text>,
        created_at -> UtcTs,
        sent_at -> Nullable<UtcTs>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    idempotency_key (idem_key) {
        idem_key -> Text,
        request_digest -> Text,
        response_status -> SmallInt,
        response_body -> Text,
        created_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::{Json, UtcTs};

    notify_receipt (id) {
        id -> BigInt,
        channel -> Text,
        received_at -> UtcTs,
        peer -> Nullable<Text>,
        request_id -> Nullable<Text>,
        headers -> Json,
        body_b64 -> Text,
        body_bytes -> Integer,
        status -> SmallInt,
        outcome -> Text,
        detail -> Nullable<Text>,
        out_trade_no -> Nullable<Text>,
        reapplied_at -> Nullable<UtcTs>,
        reapply_outcome -> Nullable<Text>,
        route -> Nullable<Text>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// Platform certificates downloaded from a provider (`crate::certificates`).
    platform_certificate (channel, mchid, serial) {
        channel -> Text,
        mchid -> Text,
        serial -> Text,
        certificate -> Text,
        effective_at -> UtcTs,
        expire_at -> UtcTs,
        fetched_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// One reconciled bill per (bill date, channel, account) (`crate::bills`).
    bill_report (bill_date, channel, account) {
        bill_date -> Text,
        channel -> Text,
        account -> Text,
        status -> Text,
        reason -> Nullable<Text>,
        fetched_at -> UtcTs,
        provider_count -> BigInt,
        provider_amount_fen -> BigInt,
        provider_refund_count -> BigInt,
        provider_refund_fen -> BigInt,
        provider_fee_fen -> BigInt,
        ours_count -> BigInt,
        ours_amount_fen -> BigInt,
        ours_refund_count -> BigInt,
        ours_refund_fen -> BigInt,
    }
}

diesel::table! {
    use diesel::sql_types::*;

    /// A difference a bill report found.
    bill_item (bill_date, channel, account, item_type, out_trade_no, out_refund_no) {
        bill_date -> Text,
        channel -> Text,
        account -> Text,
        item_type -> Text,
        out_trade_no -> Text,
        out_refund_no -> Text,
        transaction_id -> Nullable<Text>,
        provider_status -> Nullable<Text>,
        provider_fen -> Nullable<BigInt>,
        ours_status -> Nullable<Text>,
        ours_fen -> Nullable<BigInt>,
        resolution -> Text,
    }
}

diesel::table! {
    use diesel::sql_types::*;

    /// The detail rows of the bills a run is comparing.
    bill_line (bill_date, channel, account, kind, out_trade_no, out_refund_no) {
        bill_date -> Text,
        channel -> Text,
        kind -> Text,
        out_trade_no -> Text,
        out_refund_no -> Text,
        account -> Text,
        transaction_id -> Text,
        amount_fen -> BigInt,
        status -> Text,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// The lease of a bill run: one instance reconciles a (bill date, channel) at a time.
    bill_run (bill_date, channel) {
        bill_date -> Text,
        channel -> Text,
        locked_by -> Text,
        locked_until -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// Refunds started through paynotify (`src/refunds`).
    refund_request (out_refund_no) {
        out_refund_no -> Text,
        order_no -> Text,
        channel -> Text,
        account -> Text,
        transaction_id -> Text,
        amount_fen -> BigInt,
        total_fen -> BigInt,
        reason -> Nullable<Text>,
        status -> Text,
        refund_id -> Nullable<Text>,
        error_code -> Nullable<Text>,
        error_message -> Nullable<Text>,
        attempts -> Integer,
        next_attempt_at -> UtcTs,
        created_at -> UtcTs,
        updated_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::{Json, UtcTs};

    payment_anomaly (biz_key) {
        biz_key -> Text,
        order_no -> Text,
        payload -> Json,
        created_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    transfer (out_bill_no) {
        out_bill_no -> Text,
        channel -> Text,
        account -> Text,
        amount_fen -> BigInt,
        remark -> Text,
        payee -> Text,
        request -> Text,
        request_digest -> Text,
        status -> Text,
        provider_state -> Nullable<Text>,
        provider_bill_no -> Nullable<Text>,
        package_info -> Nullable<Text>,
        fail_reason -> Nullable<Text>,
        attempts -> Integer,
        next_attempt_at -> UtcTs,
        created_at -> UtcTs,
        updated_at -> UtcTs,
        finished_at -> Nullable<UtcTs>,
    }
}

diesel::table! {
    transfer_account (channel, account) {
        channel -> Text,
        account -> Text,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::{Json, UtcTs};

    transfer_anomaly (biz_key) {
        biz_key -> Text,
        out_bill_no -> Text,
        payload -> Json,
        created_at -> UtcTs,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use crate::store::types::UtcTs;

    /// Provider accounts added through `/admin/merchants` (src/merchants/store.rs).
    merchant_account (channel, account) {
        channel -> Text,
        account -> Text,
        mode -> Text,
        sp_account -> Nullable<Text>,
        /// `AccountSettings` as JSON: no keys.
        settings -> Text,
        status -> Text,
        keys_version -> BigInt,
        key_id -> Text,
        /// Base64 of the sealed `keys` object (src/merchants/seal.rs).
        sealed_keys -> Text,
        created_at -> UtcTs,
        updated_at -> UtcTs,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    combined_order,
    merchant_account,
    transfer,
    transfer_account,
    transfer_anomaly,
    payment_anomaly,
    bill_report,
    bill_item,
    bill_line,
    bill_run,
    notify_receipt,
    platform_certificate,
    orders,
    order_account,
    pay_callback,
    refund_callback,
    refund_request,
    status_callback,
    local_message,
    idempotency_key,
);
