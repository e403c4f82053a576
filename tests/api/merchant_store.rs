//! The `merchant_account` table (src/merchants/store.rs) on every backend: one row per
//! account, pages in order, optimistic updates, the reload's changes, a rotation that is all
//! or nothing, and a database dump that holds no key.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{TimeZone, Utc};
use paynotify::channel::accounts::{AccountSettings, Mode};
use paynotify::merchants::rotate::{RotateError, rotate};
use paynotify::merchants::seal::{MasterKey, SealError};
use paynotify::merchants::store::{MerchantFilter, ResealError, Status, StoredAccount};
use paynotify::notice::ChannelId;
use paynotify::store::Store;
use paynotify::time::Timestamp;

use crate::support::helpers::{Backend, TestDb, test_settings};

crate::on_every_backend!(
    an_account_is_stored_once,
    pages_are_sorted_by_channel_and_account_and_filtered,
    an_update_from_a_stale_version_changes_nothing,
    the_reload_reads_the_rows_changed_at_or_after_its_last_read,
    a_rotation_reseals_every_row_or_none,
    a_dump_of_the_table_holds_no_key_material,
);

/// A private key's body as it would appear in a dump if it were stored in clear.
const PEM_BODY: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDpaynotifyTEST";
const APIV3_KEY: &str = "apiv3keyapiv3keyapiv3keyapiv3key";

pub(crate) fn key(byte: u8) -> MasterKey {
    MasterKey::from_base64("secrets.master_key", &STANDARD.encode([byte; 32])).expect("key")
}

fn at(minute: u32) -> Timestamp {
    Timestamp::new(
        Utc.with_ymd_and_hms(2026, 12, 19, 8, minute, 0)
            .single()
            .expect("time"),
    )
}

fn keys_json() -> String {
    serde_json::json!({
        "apiv3_key": APIV3_KEY,
        "private_key_pem": format!("-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\n"),
        "merchant_serial": "SERIAL0001",
    })
    .to_string()
}

pub(crate) fn account(
    master: &MasterKey,
    channel: ChannelId,
    id: &str,
    when: Timestamp,
) -> StoredAccount {
    StoredAccount {
        channel,
        account: id.to_owned(),
        mode: Mode::Direct,
        sp_account: None,
        settings: AccountSettings {
            appids: vec!["wx0000000000000001".to_owned()],
            ..AccountSettings::default()
        },
        status: Status::Enabled,
        keys_version: 1,
        sealed: master
            .seal(channel, id, keys_json().as_bytes())
            .expect("seal"),
        created_at: when,
        updated_at: when,
    }
}

fn sub(master: &MasterKey, id: &str, sp: &str, status: Status) -> StoredAccount {
    StoredAccount {
        mode: Mode::PartnerSub,
        sp_account: Some(sp.to_owned()),
        status,
        sealed: master.seal(ChannelId::Wechat, id, b"{}").expect("seal"),
        ..account(master, ChannelId::Wechat, id, at(0))
    }
}

async fn store(backend: Backend) -> (TestDb, Store) {
    let db = TestDb::create(backend).await;
    let store = Store::connect(&test_settings(db.url()).database).expect("store");
    store.migrate().await.expect("migrations");
    (db, store)
}

fn ids(accounts: &[StoredAccount]) -> Vec<String> {
    accounts
        .iter()
        .map(|a| format!("{}/{}", a.channel, a.account))
        .collect()
}

async fn an_account_is_stored_once(backend: Backend) {
    let (_db, store) = store(backend).await;
    let master = key(1);
    let first = account(&master, ChannelId::Wechat, "1900000101", at(0));
    assert!(store.insert_merchant(&first).await.expect("insert"));
    let mut again = account(&master, ChannelId::Wechat, "1900000101", at(1));
    again.status = Status::Disabled;
    assert!(!store.insert_merchant(&again).await.expect("insert again"));
    // The same id on the other channel is another account.
    let alipay = account(&master, ChannelId::Alipay, "1900000101", at(0));
    assert!(store.insert_merchant(&alipay).await.expect("insert alipay"));

    let stored = store
        .merchant(ChannelId::Wechat, "1900000101")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(stored, first);
    let keys = master
        .open(ChannelId::Wechat, "1900000101", &stored.sealed)
        .expect("opens");
    assert_eq!(keys, keys_json().as_bytes());
    assert!(
        store
            .merchant(ChannelId::Wechat, "1900000102")
            .await
            .expect("read")
            .is_none()
    );
}

async fn pages_are_sorted_by_channel_and_account_and_filtered(backend: Backend) {
    let (_db, store) = store(backend).await;
    let master = key(1);
    for (channel, id) in [
        (ChannelId::Wechat, "1900000103"),
        (ChannelId::Alipay, "2021000000000001"),
        (ChannelId::Wechat, "1900000101"),
        (ChannelId::Wechat, "1900000102"),
    ] {
        assert!(
            store
                .insert_merchant(&account(&master, channel, id, at(0)))
                .await
                .expect("insert")
        );
    }
    for (id, status) in [
        ("1900000201", Status::Enabled),
        ("1900000202", Status::Enabled),
        ("1900000203", Status::Disabled),
    ] {
        assert!(
            store
                .insert_merchant(&sub(&master, id, "1900000101", status))
                .await
                .expect("insert sub")
        );
    }
    let all = MerchantFilter {
        channel: None,
        status: None,
        after: None,
        limit: 1000,
    };
    let listed = store.merchants(&all).await.expect("list");
    assert_eq!(
        ids(&listed),
        [
            "alipay/2021000000000001",
            "wechat/1900000101",
            "wechat/1900000102",
            "wechat/1900000103",
            "wechat/1900000201",
            "wechat/1900000202",
            "wechat/1900000203",
        ]
    );
    let page = |after: Option<&str>| MerchantFilter {
        channel: Some(ChannelId::Wechat),
        status: Some(Status::Enabled),
        after: after.map(str::to_owned),
        limit: 2,
    };
    let first = store.merchants(&page(None)).await.expect("page 1");
    assert_eq!(ids(&first), ["wechat/1900000101", "wechat/1900000102"]);
    let second = store
        .merchants(&page(Some("1900000102")))
        .await
        .expect("page 2");
    assert_eq!(ids(&second), ["wechat/1900000103", "wechat/1900000201"]);
    let third = store
        .merchants(&page(Some("1900000201")))
        .await
        .expect("page 3");
    assert_eq!(ids(&third), ["wechat/1900000202"]);
    let disabled = MerchantFilter {
        status: Some(Status::Disabled),
        ..all.clone()
    };
    assert_eq!(
        ids(&store.merchants(&disabled).await.expect("disabled")),
        ["wechat/1900000203"]
    );

    assert_eq!(
        store
            .count_subs_enabled(ChannelId::Wechat, "1900000101")
            .await
            .expect("count"),
        2
    );
    assert_eq!(
        store
            .count_subs_enabled(ChannelId::Alipay, "1900000101")
            .await
            .expect("count"),
        0
    );
    assert_eq!(store.all_merchants().await.expect("all").len(), 7);
}

async fn an_update_from_a_stale_version_changes_nothing(backend: Backend) {
    let (_db, store) = store(backend).await;
    let master = key(1);
    let stored = account(&master, ChannelId::Wechat, "1900000101", at(0));
    assert!(store.insert_merchant(&stored).await.expect("insert"));

    let mut rotated = stored.clone();
    rotated.keys_version = 2;
    rotated
        .settings
        .appids
        .push("wx0000000000000002".to_owned());
    rotated.sealed = master
        .seal(ChannelId::Wechat, "1900000101", b"{\"apiv3_key\":\"new\"}")
        .expect("seal");
    rotated.updated_at = at(5);
    assert!(store.update_merchant(&rotated, 1).await.expect("update"));

    // A second change that read version 1 too loses.
    let mut stale = stored.clone();
    stale.keys_version = 2;
    stale.status = Status::Disabled;
    stale.updated_at = at(6);
    assert!(!store.update_merchant(&stale, 1).await.expect("stale"));
    let now = store
        .merchant(ChannelId::Wechat, "1900000101")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(now, rotated);

    // An account not stored is not updated either.
    let mut unknown = rotated.clone();
    unknown.account = "1900000999".to_owned();
    assert!(!store.update_merchant(&unknown, 2).await.expect("unknown"));
}

async fn the_reload_reads_the_rows_changed_at_or_after_its_last_read(backend: Backend) {
    let (_db, store) = store(backend).await;
    let master = key(1);
    for (id, minute) in [("1900000101", 1), ("1900000102", 2), ("1900000103", 3)] {
        assert!(
            store
                .insert_merchant(&account(&master, ChannelId::Wechat, id, at(minute)))
                .await
                .expect("insert")
        );
    }
    let changed = store.merchants_changed_since(at(2)).await.expect("since");
    assert_eq!(ids(&changed), ["wechat/1900000102", "wechat/1900000103"]);

    let mut first = account(&master, ChannelId::Wechat, "1900000101", at(1));
    first.keys_version = 2;
    first.status = Status::Disabled;
    first.updated_at = at(4);
    assert!(store.update_merchant(&first, 1).await.expect("update"));
    let changed = store.merchants_changed_since(at(3)).await.expect("since");
    assert_eq!(ids(&changed), ["wechat/1900000103", "wechat/1900000101"]);
    assert_eq!(changed[1].status, Status::Disabled);
    assert!(
        store
            .merchants_changed_since(at(5))
            .await
            .expect("since")
            .is_empty()
    );
}

async fn a_rotation_reseals_every_row_or_none(backend: Backend) {
    let (_db, store) = store(backend).await;
    let (old, new) = (key(1), key(2));
    let ids_in_order = ["1900000101", "1900000102", "1900000103"];
    for id in ids_in_order {
        assert!(
            store
                .insert_merchant(&account(&old, ChannelId::Wechat, id, at(0)))
                .await
                .expect("insert")
        );
    }
    // One row no key of the rotation opens: nothing is resealed, and the row is named.
    let stranger = key(3);
    assert!(
        store
            .insert_merchant(&account(
                &stranger,
                ChannelId::Alipay,
                "2021000000000009",
                at(0)
            ))
            .await
            .expect("insert")
    );
    let before = store.all_merchants().await.expect("all");
    let err = rotate(&store, &old, &new)
        .await
        .expect_err("a row not under the old key");
    match &err {
        RotateError::Reseal(ResealError::Account { account, .. }) => {
            assert_eq!(account, "2021000000000009")
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(stranger.id()), "{err}");
    assert_eq!(store.all_merchants().await.expect("all"), before);

    // Without it, every row moves to the new key; versions and times stay.
    let mut kept = store
        .merchant(ChannelId::Alipay, "2021000000000009")
        .await
        .expect("read")
        .expect("stored");
    kept.sealed = old
        .seal(
            ChannelId::Alipay,
            "2021000000000009",
            keys_json().as_bytes(),
        )
        .expect("seal");
    kept.keys_version = 2;
    assert!(store.update_merchant(&kept, 1).await.expect("update"));
    assert!(matches!(
        rotate(&store, &old, &old).await,
        Err(RotateError::SameKey(_))
    ));
    assert_eq!(rotate(&store, &old, &new).await.expect("rotate"), 4);
    let after = store.all_merchants().await.expect("all");
    assert_eq!(after.len(), 4);
    for a in &after {
        assert_eq!(a.sealed.key_id, new.id());
        let keys = new
            .open(a.channel, &a.account, &a.sealed)
            .expect("opens with the new key");
        assert_eq!(keys, keys_json().as_bytes());
        assert!(matches!(
            old.open(a.channel, &a.account, &a.sealed),
            Err(SealError::WrongKey { .. })
        ));
        let was = before
            .iter()
            .find(|b| b.account == a.account)
            .expect("same rows");
        assert_eq!(a.updated_at, was.updated_at);
    }
    // Run again (its first run committed, say, but its answer was lost): every row stays.
    assert_eq!(rotate(&store, &old, &new).await.expect("again"), 4);
}

async fn a_dump_of_the_table_holds_no_key_material(backend: Backend) {
    let (db, store) = store(backend).await;
    let master = key(1);
    assert!(
        store
            .insert_merchant(&account(&master, ChannelId::Wechat, "1900000101", at(0)))
            .await
            .expect("insert")
    );
    let columns = [
        "channel",
        "account",
        "mode",
        "sp_account",
        "settings",
        "status",
        "key_id",
        "sealed_keys",
    ];
    // The search finds what is there…
    let found =
        |column: &str, needle: &str| format!("merchant_account WHERE {column} LIKE '%{needle}%'");
    assert_eq!(db.count(&found("account", "1900000101")).await, 1);
    assert_eq!(db.count(&found("settings", "wx0000000000000001")).await, 1);
    // …and no key: not in clear, nor as base64 of the clear text.
    let encoded = STANDARD.encode(keys_json());
    for needle in [PEM_BODY, APIV3_KEY, "PRIVATE KEY", &encoded[8..40]] {
        for column in columns {
            assert_eq!(
                db.count(&found(column, needle)).await,
                0,
                "{column}: {needle}"
            );
        }
    }
}
