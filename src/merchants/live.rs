//! The accounts stored through `/admin/merchants`, live in every channel: loaded at start-up
//! (every seal must open), changed by this instance before it answers, and reloaded from the
//! database every `merchants.reload_secs` so a change made on another instance verifies this
//! one's next notification.
//!
//! Changes of one instance are serialised by one lock around "write the row, change the
//! book"; the notification path never takes it (it reads the books' snapshots).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::seal::MasterKey;
use super::store::{MerchantFilter, Status, StoredAccount};
use super::view::{MerchantChange, MerchantView, NewMerchant};
use crate::channel::accounts::{AccountBook, AccountSettings, AccountSpec, Change, Invalid, Mode};
use crate::config::value::{ConfigError, invalid};
use crate::metrics::Metrics;
use crate::notice::ChannelId;
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};

/// A reload reads the rows changed since its last read less this much: another instance's
/// clock may be behind ours, and a change committed late may carry an earlier time.
const LOOKBACK_SECS: i64 = 60;

/// Why a request to `/admin/merchants` changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum MerchantError {
    /// `503`: writes need `secrets.master_key`.
    #[error("secrets.master_key is not set")]
    NoMasterKey,
    /// `400`, naming the field.
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// `404`.
    #[error("{0}")]
    NotFound(String),
    /// `409`: the account exists, is a file account, serves enabled accounts, or was changed
    /// by another request meanwhile.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `500`: the keys could not be sealed (the system's random generator failed).
    #[error("{0}")]
    Sealing(String),
}

/// `GET /admin/merchants`' query.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub channel: Option<ChannelId>,
    pub status: Option<Status>,
    pub after: Option<String>,
    pub limit: i64,
}

/// What this instance applied of one stored account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Applied {
    mode: Mode,
    status: Status,
    keys_version: i64,
    updated_at: Timestamp,
}

impl Applied {
    fn of(a: &StoredAccount) -> Self {
        Self {
            mode: a.mode,
            status: a.status,
            keys_version: a.keys_version,
            updated_at: a.updated_at,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    applied: HashMap<(ChannelId, String), Applied>,
    /// Where the next reload reads from (this instance's clock).
    read_from: Option<Timestamp>,
    /// When a reload last read the database without error.
    last_ok: Option<Instant>,
}

/// The accounts added through `/admin/merchants`, in every channel's book.
pub struct Merchants {
    store: Store,
    books: Vec<Arc<dyn AccountBook>>,
    key: Option<MasterKey>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    reload_every: Duration,
    state: tokio::sync::Mutex<State>,
}

impl Merchants {
    pub fn new(
        store: Store,
        books: Vec<Arc<dyn AccountBook>>,
        key: Option<MasterKey>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        reload_secs: u64,
    ) -> Self {
        Self {
            store,
            books,
            key,
            metrics,
            clock,
            reload_every: Duration::from_secs(reload_secs),
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    pub fn reload_every(&self) -> Duration {
        self.reload_every
    }

    fn book(&self, channel: ChannelId) -> Option<&Arc<dyn AccountBook>> {
        self.books.iter().find(|b| b.channel() == channel)
    }

    /// Start-up: every stored account, opened and installed. A stored account the master key
    /// does not open (or no key with stored accounts) stops start-up naming it: nothing is
    /// served with half the accounts.
    pub async fn load(&self) -> Result<usize, LoadError> {
        let mut state = self.state.lock().await;
        let started = self.clock.now();
        let rows = self.store.all_merchants().await?;
        if let (None, Some(first)) = (&self.key, rows.first()) {
            return Err(LoadError::Config(invalid(
                "secrets.master_key",
                format!(
                    "not set, and {} stored accounts need it (the first: {}/{})",
                    rows.len(),
                    first.channel,
                    first.account
                ),
            )));
        }
        let mut changes = Vec::new();
        for row in &rows {
            if row.status == Status::Disabled {
                continue;
            }
            let spec = self
                .open(row)
                .map_err(|why| LoadError::Config(invalid("secrets.master_key", why)))?;
            changes.push((row.channel, spec));
        }
        let refused = self.install(changes);
        for ((channel, account), why) in &refused {
            tracing::warn!(%channel, %account, error = %why, "stored account not installed");
        }
        for row in &rows {
            if !refused
                .iter()
                .any(|((c, a), _)| *c == row.channel && *a == row.account)
            {
                state
                    .applied
                    .insert((row.channel, row.account.clone()), Applied::of(row));
            }
        }
        state.read_from = Some(started);
        state.last_ok = Some(Instant::now());
        self.count(&state);
        Ok(rows.len())
    }

    /// Opens a stored account's keys: its spec, or why not in the contract's words.
    fn open(&self, row: &StoredAccount) -> Result<AccountSpec, String> {
        let Some(key) = &self.key else {
            return Err("is not set".to_owned());
        };
        let plain = key
            .open(row.channel, &row.account, &row.sealed)
            .map_err(|e| {
                format!(
                    "does not open {}/{}, sealed with key id {}: {e}",
                    row.channel, row.account, row.sealed.key_id
                )
            })?;
        let keys: Map<String, Value> = serde_json::from_slice(&plain).map_err(|e| {
            format!(
                "{}/{}: the opened keys are not a JSON object: {e}",
                row.channel, row.account
            )
        })?;
        Ok(AccountSpec {
            account: row.account.clone(),
            mode: row.mode,
            sp_account: row.sp_account.clone(),
            settings: row.settings.clone(),
            keys,
        })
    }

    /// Puts each spec into its channel's book, service providers before their
    /// sub-merchants; returns those refused.
    fn install(
        &self,
        mut specs: Vec<(ChannelId, AccountSpec)>,
    ) -> Vec<((ChannelId, String), Invalid)> {
        specs.sort_by_key(|(_, s)| s.mode == Mode::PartnerSub);
        self.change(
            specs
                .into_iter()
                .map(|(channel, spec)| (channel, Change::Put(spec)))
                .collect(),
        )
    }

    fn change(&self, changes: Vec<(ChannelId, Change)>) -> Vec<((ChannelId, String), Invalid)> {
        let now = self.clock.now();
        let mut refused = Vec::new();
        for book in &self.books {
            let channel = book.channel();
            let mine: Vec<Change> = changes
                .iter()
                .filter(|(c, _)| *c == channel)
                .map(|(_, change)| change.clone())
                .collect();
            if mine.is_empty() {
                continue;
            }
            refused.extend(
                book.apply(mine, now)
                    .into_iter()
                    .map(|(account, why)| ((channel, account), why)),
            );
        }
        refused
    }

    /// Reads the accounts changed since the last read and applies those this instance has
    /// not: how many it applied.
    pub async fn reload(&self) -> Result<usize, StoreError> {
        let mut state = self.state.lock().await;
        let now = self.clock.now();
        let since = state
            .read_from
            .map_or(Timestamp::new(chrono::DateTime::UNIX_EPOCH), |at| {
                at.plus_seconds(-LOOKBACK_SECS)
            });
        let rows = match self.store.merchants_changed_since(since).await {
            Ok(rows) => rows,
            Err(e) => {
                self.metrics
                    .account_reload
                    .with_label_values(&["failed"])
                    .inc();
                return Err(e);
            }
        };
        let fresh: Vec<&StoredAccount> = rows
            .iter()
            .filter(|r| state.applied.get(&(r.channel, r.account.clone())) != Some(&Applied::of(r)))
            .collect();
        let mut failed = false;
        let mut changes = Vec::new();
        let mut opened = Vec::new();
        for row in &fresh {
            match row.status {
                Status::Disabled => {
                    changes.push((row.channel, Change::Remove(row.account.clone())))
                }
                Status::Enabled => match self.open(row) {
                    Ok(spec) => opened.push((row.channel, spec)),
                    Err(why) => {
                        failed = true;
                        tracing::error!(channel = %row.channel, account = %row.account, error = %why, "stored account not reloaded: secrets.master_key does not open it");
                    }
                },
            }
        }
        opened.sort_by_key(|(_, s)| s.mode == Mode::PartnerSub);
        changes.extend(opened.into_iter().map(|(c, s)| (c, Change::Put(s))));
        let refused = self.change(changes);
        for ((channel, account), why) in &refused {
            failed = true;
            tracing::warn!(%channel, %account, error = %why, "stored account not reloaded");
        }
        let mut applied = 0;
        // A row that did not open or build is read again by every reload until it does (the
        // next read starts no later than its change), so a failure keeps failing loudly.
        let mut read_from = now;
        for row in fresh {
            let key = (row.channel, row.account.clone());
            let refused_here = refused.iter().any(|(k, _)| *k == key);
            let opened_here = row.status == Status::Disabled
                || self
                    .key
                    .as_ref()
                    .is_some_and(|k| k.id() == row.sealed.key_id);
            if !refused_here && opened_here {
                state.applied.insert(key, Applied::of(row));
                applied += 1;
            } else if row.updated_at.unix_seconds() + LOOKBACK_SECS < read_from.unix_seconds() {
                read_from = row.updated_at.plus_seconds(LOOKBACK_SECS);
            }
        }
        state.read_from = Some(read_from);
        if failed {
            self.metrics
                .account_reload
                .with_label_values(&["failed"])
                .inc();
        } else {
            self.metrics.account_reload.with_label_values(&["ok"]).inc();
            state.last_ok = Some(Instant::now());
        }
        self.count(&state);
        Ok(applied)
    }

    /// At every scrape: seconds since the last reload that read and applied everything.
    pub async fn observe(&self) {
        let state = self.state.lock().await;
        let lag = state.last_ok.map_or(0, |at| at.elapsed().as_secs());
        self.metrics
            .account_reload_lag_seconds
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// `paynotify_accounts`, from the file's accounts and those this instance applied.
    fn count(&self, state: &State) {
        let gauge = &self.metrics.accounts;
        gauge.reset();
        for book in &self.books {
            let n = book.configured().len();
            if n > 0 {
                gauge
                    .with_label_values(&[book.channel().as_str(), "direct", "config", "enabled"])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        // Summed per label first: one gauge update per label, not one per account (this
        // runs after every add, with thousands of accounts applied).
        let mut per_label: HashMap<(&str, &str, &str), i64> = HashMap::new();
        for ((channel, _), a) in &state.applied {
            *per_label
                .entry((channel.as_str(), a.mode.as_str(), a.status.as_str()))
                .or_default() += 1;
        }
        for ((channel, mode, status), n) in per_label {
            gauge
                .with_label_values(&[channel, mode, "api", status])
                .set(n);
        }
    }

    fn key(&self) -> Result<&MasterKey, MerchantError> {
        self.key.as_ref().ok_or(MerchantError::NoMasterKey)
    }

    fn is_file_account(&self, channel: ChannelId, account: &str) -> bool {
        self.book(channel)
            .is_some_and(|b| b.configured().iter().any(|c| c.account == account))
    }

    /// `POST /admin/merchants`.
    pub async fn create(&self, new: NewMerchant) -> Result<MerchantView, MerchantError> {
        let key = self.key()?;
        let channel = parse_channel(&new.channel)?;
        let mode = Mode::parse(&new.mode).ok_or_else(|| {
            Invalid::new(
                "mode",
                format!("unknown mode {:?} (direct or partner_sub)", new.mode),
            )
        })?;
        let api_base = api_base_of(channel, new.api_base, new.gateway)?;
        let settings = AccountSettings {
            appids: new.appids.unwrap_or_default(),
            seller_id: new.seller_id,
            api_base,
            certificates: new.certificates,
            facts: Default::default(),
        };
        let spec = AccountSpec {
            account: new.account,
            mode,
            sp_account: new.sp_account,
            settings,
            keys: new.keys.unwrap_or_default(),
        };
        let book = self
            .book(channel)
            .ok_or_else(|| Invalid::new("channel", "not built"))?;
        let mut state = self.state.lock().await;
        let now = self.clock.now();
        let facts = book.check(&spec, now)?;
        if self.is_file_account(channel, &spec.account) {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{} is configured in the file",
                spec.account
            )));
        }
        let mut settings = spec.settings.clone();
        settings.facts = facts;
        let row = StoredAccount {
            channel,
            account: spec.account.clone(),
            mode,
            sp_account: spec.sp_account.clone(),
            settings,
            status: Status::Enabled,
            keys_version: 1,
            sealed: seal(key, channel, &spec.account, &spec.keys)?,
            created_at: now,
            updated_at: now,
        };
        if !self.store.insert_merchant(&row).await? {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{} exists",
                spec.account
            )));
        }
        self.applied(&mut state, &row, Change::Put(spec));
        tracing::info!(%channel, account = %row.account, mode = mode.as_str(), "account added");
        Ok(MerchantView::stored(&row))
    }

    /// Installs `change` for `row`, just written, and remembers it as applied.
    fn applied(&self, state: &mut State, row: &StoredAccount, change: Change) {
        for ((channel, account), why) in self.change(vec![(row.channel, change)]) {
            // It passed the same check a moment ago: only a certificate expiring in between.
            tracing::warn!(%channel, %account, error = %why, "account stored but not installed");
        }
        state
            .applied
            .insert((row.channel, row.account.clone()), Applied::of(row));
        self.count(state);
    }

    /// `GET /admin/merchants/{channel}/{account}`.
    pub async fn get(&self, channel: &str, account: &str) -> Result<MerchantView, MerchantError> {
        let not_found = || MerchantError::NotFound(format!("no account {channel}/{account}"));
        let Some(channel) = ChannelId::parse(channel) else {
            return Err(not_found());
        };
        if let Some(book) = self.book(channel)
            && let Some(c) = book.configured().iter().find(|c| c.account == account)
        {
            return Ok(MerchantView::configured(channel, c));
        }
        match self.store.merchant(channel, account).await? {
            Some(row) => Ok(MerchantView::stored(&row)),
            None => Err(not_found()),
        }
    }

    /// `GET /admin/merchants`: file and stored accounts, sorted by `(channel, account)`.
    pub async fn list(&self, filter: ListFilter) -> Result<Vec<MerchantView>, MerchantError> {
        if filter.after.is_some() && filter.channel.is_none() {
            return Err(Invalid::new("after", "give channel with it").into());
        }
        let mut views: Vec<MerchantView> = Vec::new();
        if filter.status != Some(Status::Disabled) {
            for book in &self.books {
                let channel = book.channel();
                if filter.channel.is_some_and(|c| c != channel) {
                    continue;
                }
                views.extend(
                    book.configured()
                        .iter()
                        .filter(|c| filter.after.as_ref().is_none_or(|after| c.account > *after))
                        .map(|c| MerchantView::configured(channel, c)),
                );
            }
        }
        let stored = self
            .store
            .merchants(&MerchantFilter {
                channel: filter.channel,
                status: filter.status,
                after: filter.after.clone(),
                limit: filter.limit,
            })
            .await?;
        views.extend(stored.iter().map(MerchantView::stored));
        views.sort_by(|a, b| (&a.channel, &a.account).cmp(&(&b.channel, &b.account)));
        views.truncate(usize::try_from(filter.limit).unwrap_or(0));
        Ok(views)
    }

    /// The stored account `(channel, account)` for a change: 404 unknown, 409 a file account.
    async fn stored(&self, channel: &str, account: &str) -> Result<StoredAccount, MerchantError> {
        let not_found = || MerchantError::NotFound(format!("no account {channel}/{account}"));
        let Some(id) = ChannelId::parse(channel) else {
            return Err(not_found());
        };
        if self.is_file_account(id, account) {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{account} is configured in the file: change it there"
            )));
        }
        self.store
            .merchant(id, account)
            .await?
            .ok_or_else(not_found)
    }

    /// `PATCH /admin/merchants/{channel}/{account}`: rotates keys, changes settings,
    /// re-enables; bumps `keys_version`.
    pub async fn update(
        &self,
        channel: &str,
        account: &str,
        change: MerchantChange,
    ) -> Result<MerchantView, MerchantError> {
        let key = self.key()?;
        let mut state = self.state.lock().await;
        let row = self.stored(channel, account).await?;
        for (field, given, actual) in [
            (
                "channel",
                &change.channel,
                Some(row.channel.as_str().to_owned()),
            ),
            ("account", &change.account, Some(row.account.clone())),
            ("mode", &change.mode, Some(row.mode.as_str().to_owned())),
            ("sp_account", &change.sp_account, row.sp_account.clone()),
        ] {
            if given.is_some() && *given != actual {
                return Err(Invalid::new(field, "cannot change: add another account").into());
            }
        }
        let status = match change.status.as_deref() {
            None => row.status,
            Some("enabled") => Status::Enabled,
            Some(other) => {
                return Err(Invalid::new(
                    "status",
                    format!("{other:?}: only \"enabled\" (DELETE disables)"),
                )
                .into());
            }
        };
        let mut spec = self
            .open(&row)
            .map_err(|why| MerchantError::Sealing(format!("secrets.master_key {why}")))?;
        let settings = &mut spec.settings;
        if let Some(appids) = change.appids {
            settings.appids = appids;
        }
        if change.seller_id.is_some() {
            settings.seller_id = change.seller_id;
        }
        if let Some(base) = api_base_of(row.channel, change.api_base, change.gateway)? {
            settings.api_base = Some(base);
        }
        if change.certificates.is_some() {
            settings.certificates = change.certificates;
        }
        for (name, value) in change.keys.unwrap_or_default() {
            if value.is_null() {
                spec.keys.remove(&name);
            } else {
                spec.keys.insert(name, value);
            }
        }
        let book = self
            .book(row.channel)
            .ok_or_else(|| Invalid::new("channel", "not built"))?;
        let now = self.clock.now();
        let facts = book.check(&spec, now)?;
        spec.settings.facts = facts;
        let next = StoredAccount {
            settings: spec.settings.clone(),
            status,
            keys_version: row.keys_version + 1,
            sealed: seal(key, row.channel, &row.account, &spec.keys)?,
            updated_at: now,
            ..row.clone()
        };
        if !self.store.update_merchant(&next, row.keys_version).await? {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{account} was changed by another request meanwhile: read it again"
            )));
        }
        let installed = match status {
            Status::Enabled => Change::Put(spec),
            Status::Disabled => Change::Remove(row.account.clone()),
        };
        self.applied(&mut state, &next, installed);
        tracing::info!(%channel, %account, keys_version = next.keys_version, "account changed");
        Ok(MerchantView::stored(&next))
    }

    /// `DELETE /admin/merchants/{channel}/{account}`: disables; a repeat changes nothing.
    pub async fn disable(
        &self,
        channel: &str,
        account: &str,
    ) -> Result<MerchantView, MerchantError> {
        self.key()?;
        let mut state = self.state.lock().await;
        let row = self.stored(channel, account).await?;
        if row.status == Status::Disabled {
            return Ok(MerchantView::stored(&row));
        }
        let subs = self
            .store
            .count_subs_enabled(row.channel, &row.account)
            .await?;
        if subs > 0 {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{account} serves {subs} enabled partner_sub accounts: disable them first"
            )));
        }
        let next = StoredAccount {
            status: Status::Disabled,
            updated_at: self.clock.now(),
            ..row.clone()
        };
        if !self.store.update_merchant(&next, row.keys_version).await? {
            return Err(MerchantError::Conflict(format!(
                "{channel}/{account} was changed by another request meanwhile: read it again"
            )));
        }
        self.applied(&mut state, &next, Change::Remove(row.account.clone()));
        tracing::info!(%channel, %account, "account disabled");
        Ok(MerchantView::stored(&next))
    }
}

/// Why start-up stopped while loading the stored accounts.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Config(ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn parse_channel(channel: &str) -> Result<ChannelId, Invalid> {
    ChannelId::parse(channel).ok_or_else(|| {
        Invalid::new(
            "channel",
            format!("unknown channel {channel:?} (wechat or alipay)"),
        )
    })
}

/// WeChat's `api_base` or Alipay's `gateway`; the other channel's name is refused.
fn api_base_of(
    channel: ChannelId,
    api_base: Option<String>,
    gateway: Option<String>,
) -> Result<Option<String>, Invalid> {
    match (channel, api_base, gateway) {
        (ChannelId::Wechat, _, Some(_)) => Err(Invalid::new(
            "gateway",
            "only for Alipay (WeChat: api_base)",
        )),
        (ChannelId::Alipay, Some(_), _) => Err(Invalid::new(
            "api_base",
            "only for WeChat (Alipay: gateway)",
        )),
        (ChannelId::Wechat, base, None) => Ok(base),
        (ChannelId::Alipay, None, gateway) => Ok(gateway),
    }
}

fn seal(
    key: &MasterKey,
    channel: ChannelId,
    account: &str,
    keys: &Map<String, Value>,
) -> Result<super::seal::Sealed, MerchantError> {
    let plain = serde_json::to_vec(keys).map_err(|e| MerchantError::Sealing(e.to_string()))?;
    key.seal(channel, account, &plain)
        .map_err(|e| MerchantError::Sealing(e.to_string()))
}
