//! Where the gate and the stream sink find their Redis: `redis.url` (one node or a cluster),
//! or the master that Redis Sentinel names (`redis.sentinels`, `redis.sentinel_master`), and
//! for the stream `relay.redis_url` before either. Checked without connecting.

use serde::{Deserialize, Deserializer};

use super::urls::RedisNodes;
use super::value::{ConfigError, Secret, invalid};
use super::{RedisSettings, RelaySettings};

/// Longest `redis.wait_timeout_ms`: a batch of the stream sink waits this long at most for
/// its replicas.
const MAX_WAIT_TIMEOUT_MS: u64 = 60_000;
/// Most replicas `redis.wait_replicas` may ask for.
const MAX_WAIT_REPLICAS: u32 = 64;

/// The Redis a connection goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// A URL: one node or a cluster's seed nodes.
    Nodes(RedisNodes),
    /// Whichever node the sentinels name master.
    Sentinels(Sentinels),
}

/// `redis.sentinels`, `redis.sentinel_master`, `redis.sentinel_password`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentinels {
    /// Host and port of each sentinel, in the order given (asked in that order).
    pub addresses: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under (`sentinel monitor NAME …`).
    pub master: String,
    /// The sentinels' password (`requirepass` on the sentinels); empty: none.
    pub password: Secret,
}

/// `redis.sentinels` as a TOML list, or (from an environment variable) one string with the
/// addresses separated by commas.
pub(super) fn address_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Form::deserialize(d)? {
        Form::List(list) => list,
        Form::Text(text) if text.trim().is_empty() => Vec::new(),
        Form::Text(text) => text.split(',').map(|a| a.trim().to_owned()).collect(),
    })
}

/// One sentinel's `host:port` (`[v6]:port` for an IPv6 address).
fn parse_address(index: usize, address: &str) -> Result<(String, u16), ConfigError> {
    let key = format!("redis.sentinels[{index}]");
    let malformed = || {
        invalid(
            key.clone(),
            "must be host:port (a sentinel's address, e.g. \"10.0.0.1:26379\"; no scheme, no password)",
        )
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(malformed)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').ok_or_else(malformed)?,
        None if host.contains(':') => return Err(malformed()),
        None => host,
    };
    let port: u16 = port.parse().map_err(|_| malformed())?;
    let plain = |c: char| c.is_ascii_alphanumeric() || ".-_:".contains(c);
    if host.is_empty() || port == 0 || !host.chars().all(plain) {
        return Err(malformed());
    }
    Ok((host.to_owned(), port))
}

impl RedisSettings {
    /// Whether the gate has a Redis at all (`redis.url` or `redis.sentinels`).
    pub fn is_set(&self) -> bool {
        !self.url.is_empty() || !self.sentinels.is_empty()
    }

    /// The Redis `[redis]` names, `None` when it names none; a mistake names its key.
    pub fn target(&self) -> Result<Option<RedisTarget>, ConfigError> {
        if self.sentinels.is_empty() {
            if !self.sentinel_master.is_empty() {
                return Err(invalid(
                    "redis.sentinel_master",
                    "is set but redis.sentinels is empty",
                ));
            }
            if !self.sentinel_password.is_empty() {
                return Err(invalid(
                    "redis.sentinel_password",
                    "is set but redis.sentinels is empty",
                ));
            }
            if self.url.is_empty() {
                return Ok(None);
            }
            return RedisNodes::parse(self.url.expose()).map(|n| Some(RedisTarget::Nodes(n)));
        }
        if !self.url.is_empty() {
            return Err(invalid(
                "redis.sentinels",
                "and redis.url are both set: give redis.url (one node or a cluster) or \
                 redis.sentinels with redis.sentinel_master, not both",
            ));
        }
        let master = self.sentinel_master.trim();
        if master.is_empty() {
            return Err(invalid(
                "redis.sentinel_master",
                "must be set when redis.sentinels is (the name the sentinels monitor the master under)",
            ));
        }
        if master.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("redis.sentinel_master", "must not contain spaces"));
        }
        let addresses = self
            .sentinels
            .iter()
            .enumerate()
            .map(|(i, a)| parse_address(i, a))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(RedisTarget::Sentinels(Sentinels {
            addresses,
            master: master.to_owned(),
            password: self.sentinel_password.clone(),
        })))
    }

    /// Replicas a stream write on `target` must reach before it counts as sent:
    /// `redis.wait_replicas`, by default 1 through sentinels and 0 otherwise.
    pub fn wait_replicas_for(&self, target: &RedisTarget) -> u32 {
        self.wait_replicas
            .unwrap_or(u32::from(matches!(target, RedisTarget::Sentinels(_))))
    }

    /// `redis.wait_replicas` and `redis.wait_timeout_ms` (the rest of the section is checked
    /// by its `Validate`, which calls this).
    pub(super) fn validate_target(&self) -> Result<(), ConfigError> {
        self.target()?;
        if self.wait_replicas.is_some_and(|n| n > MAX_WAIT_REPLICAS) {
            return Err(invalid(
                "redis.wait_replicas",
                format!("must be between 0 and {MAX_WAIT_REPLICAS}"),
            ));
        }
        if !(1..=MAX_WAIT_TIMEOUT_MS).contains(&self.wait_timeout_ms) {
            return Err(invalid(
                "redis.wait_timeout_ms",
                format!("must be between 1 and {MAX_WAIT_TIMEOUT_MS}"),
            ));
        }
        Ok(())
    }
}

impl RelaySettings {
    /// The key naming the stream sink's Redis and where it is: `relay.redis_url` when set,
    /// else the `[redis]` connection (`redis.url` or the sentinels).
    pub fn stream_target(
        &self,
        redis: &RedisSettings,
    ) -> Result<(&'static str, RedisTarget), ConfigError> {
        if !self.redis_url.is_empty() {
            let nodes = RedisNodes::parse(self.redis_url.expose()).map_err(|e| match e {
                ConfigError::Invalid { message, .. } => invalid("relay.redis_url", message),
                other => other,
            })?;
            return Ok(("relay.redis_url", RedisTarget::Nodes(nodes)));
        }
        match redis.target()? {
            Some(target @ RedisTarget::Sentinels(_)) => Ok(("redis.sentinels", target)),
            Some(target) => Ok(("redis.url", target)),
            None => Err(invalid(
                "relay.redis_url",
                "(or redis.url, or redis.sentinels) must be set when relay.sink = \"redis-stream\"",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::load;
    use super::*;

    fn key_of(err: &ConfigError) -> &str {
        match err {
            ConfigError::Invalid { key, .. } => key,
            ConfigError::File { .. } => "",
        }
    }

    const SENTINELS: &str = "[redis]\nsentinels = [\"10.0.0.1:26379\", \"s2.example:26380\", \"[::1]:26381\"]\nsentinel_master = \"pay\"\n";

    #[test]
    fn sentinels_name_the_master_and_wait_for_one_replica_by_default() {
        let s = load(SENTINELS, &[]).expect("sentinels");
        assert!(s.redis.is_set());
        let target = s.redis.target().expect("valid").expect("set");
        let RedisTarget::Sentinels(sentinels) = &target else {
            panic!("{target:?}");
        };
        assert_eq!(
            sentinels.addresses,
            [
                ("10.0.0.1".to_owned(), 26379),
                ("s2.example".to_owned(), 26380),
                ("::1".to_owned(), 26381)
            ]
        );
        assert_eq!(sentinels.master, "pay");
        assert!(sentinels.password.is_empty());
        assert_eq!(s.redis.wait_replicas_for(&target), 1);
        assert_eq!(s.redis.wait_timeout_ms, 1000);

        let plain = load("[redis]\nurl = \"redis://127.0.0.1:6379\"\n", &[]).expect("url");
        let target = plain.redis.target().expect("valid").expect("set");
        assert_eq!(plain.redis.wait_replicas_for(&target), 0);
        let none = load("", &[]).expect("defaults");
        assert!(!none.redis.is_set());
        assert_eq!(none.redis.target().expect("valid"), None);

        let explicit = load(
            &format!("{SENTINELS}wait_replicas = 2\nwait_timeout_ms = 250\n"),
            &[],
        )
        .expect("explicit");
        let target = explicit.redis.target().expect("valid").expect("set");
        assert_eq!(explicit.redis.wait_replicas_for(&target), 2);
        assert_eq!(explicit.redis.wait_timeout_ms, 250);
        let zero = load(&format!("{SENTINELS}wait_replicas = 0\n"), &[]).expect("zero");
        let target = zero.redis.target().expect("valid").expect("set");
        assert_eq!(zero.redis.wait_replicas_for(&target), 0);
    }

    #[test]
    fn sentinel_mistakes_stop_start_up_naming_the_key() {
        let cases = [
            (
                "[redis]\nurl = \"redis://a:6379\"\nsentinels = [\"a:26379\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels",
            ),
            (
                "[redis]\nsentinels = [\"a:26379\"]\n",
                "redis.sentinel_master",
            ),
            (
                "[redis]\nsentinels = [\"a:26379\"]\nsentinel_master = \"two words\"\n",
                "redis.sentinel_master",
            ),
            (
                "[redis]\nsentinel_master = \"m\"\n",
                "redis.sentinel_master",
            ),
            (
                "[redis]\nurl = \"redis://a:6379\"\nsentinel_password = \"pw\"\n",
                "redis.sentinel_password",
            ),
            (
                "[redis]\nsentinels = [\"a:26379\", \"b\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[1]",
            ),
            (
                "[redis]\nsentinels = [\"redis://a:26379\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\"a:0\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\"a:70000\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\":26379\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\"::1:26379\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\"u:pw@a:26379\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[0]",
            ),
            (
                "[redis]\nsentinels = [\"a:26379\", \"\"]\nsentinel_master = \"m\"\n",
                "redis.sentinels[1]",
            ),
            ("[redis]\nwait_timeout_ms = 0\n", "redis.wait_timeout_ms"),
            (
                "[redis]\nwait_timeout_ms = 60001\n",
                "redis.wait_timeout_ms",
            ),
            ("[redis]\nwait_replicas = 65\n", "redis.wait_replicas"),
        ];
        for (file, key) in cases {
            let err = load(file, &[]).expect_err(file);
            assert_eq!(key_of(&err), key, "{file}: {err}");
        }
    }

    #[test]
    fn sentinels_come_from_the_environment_as_a_comma_separated_list() {
        let s = load(
            "",
            &[
                ("PAYNOTIFY__REDIS__SENTINELS", "a:26379, b:26380"),
                ("PAYNOTIFY__REDIS__SENTINEL_MASTER", "pay"),
                ("PAYNOTIFY__REDIS__SENTINEL_PASSWORD", "00s3cret"),
                ("PAYNOTIFY__REDIS__WAIT_REPLICAS", "2"),
                ("PAYNOTIFY__REDIS__WAIT_TIMEOUT_MS", "500"),
            ],
        )
        .expect("from the environment");
        let Some(RedisTarget::Sentinels(sentinels)) = s.redis.target().expect("valid") else {
            panic!("sentinels expected");
        };
        assert_eq!(
            sentinels.addresses,
            [("a".to_owned(), 26379), ("b".to_owned(), 26380)]
        );
        assert_eq!(sentinels.password.expose(), "00s3cret");
        assert_eq!(s.redis.wait_replicas, Some(2));
        assert_eq!(s.redis.wait_timeout_ms, 500);
        let err = load(
            "",
            &[
                ("PAYNOTIFY__REDIS__SENTINELS", "a:26379,,b:1"),
                ("PAYNOTIFY__REDIS__SENTINEL_MASTER", "pay"),
            ],
        )
        .expect_err("an empty entry");
        assert_eq!(key_of(&err), "redis.sentinels[1]", "{err}");
    }

    #[test]
    fn the_sentinel_password_never_shows() {
        let s = load(
            &format!("{SENTINELS}sentinel_password = \"SENTINEL-SECRET\"\n"),
            &[],
        )
        .expect("password");
        let target = s.redis.target().expect("valid");
        for shown in [format!("{s:?}"), format!("{target:?}")] {
            assert!(!shown.contains("SENTINEL-SECRET"), "{shown}");
        }
    }

    #[test]
    fn the_stream_sink_takes_relay_redis_url_else_the_redis_section_sentinels_included() {
        let s = load(
            &format!("{SENTINELS}[relay]\nsink = \"redis-stream\"\n"),
            &[],
        )
        .expect("stream through sentinels");
        let (key, target) = s.relay.stream_target(&s.redis).expect("target");
        assert_eq!(key, "redis.sentinels");
        assert!(matches!(target, RedisTarget::Sentinels(_)));
        let s = load(
            &format!(
                "{SENTINELS}[relay]\nsink = \"redis-stream\"\nredis_url = \"redis://events:6380\"\n"
            ),
            &[],
        )
        .expect("a stream Redis of its own");
        let (key, target) = s.relay.stream_target(&s.redis).expect("target");
        assert_eq!(key, "relay.redis_url");
        assert_eq!(
            target,
            RedisTarget::Nodes(RedisNodes::Single("redis://events:6380".to_owned()))
        );
        // A stream of its own on one node waits for no replica unless told.
        assert_eq!(s.redis.wait_replicas_for(&target), 0);
        let err = load(
            "[relay]\nsink = \"redis-stream\"\nredis_url = \"http://x\"\n",
            &[],
        )
        .expect_err("a bad stream URL");
        assert_eq!(key_of(&err), "relay.redis_url", "{err}");
        let err = load("[relay]\nsink = \"redis-stream\"\n", &[]).expect_err("no Redis at all");
        assert!(err.to_string().contains("redis.sentinels"), "{err}");
    }
}
