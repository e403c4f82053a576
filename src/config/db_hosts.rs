//! `database.url` naming several servers, checked at start-up without connecting.
//!
//! PostgreSQL: `postgres://user[:password]@h1:5432,h2:5433/db?target_session_attrs=read-write`.
//! The driver (tokio-postgres) tries the hosts in order and keeps the first that accepts
//! writes; with several hosts `target_session_attrs=read-write` is required (without it a
//! standby could be chosen). A URL without `connect_timeout` gets
//! [`DEFAULT_CONNECT_TIMEOUT_SECS`], so a server that stops answering without refusing does
//! not hold a new connection for the operating system's TCP timeout.
//!
//! MySQL/MariaDB: `mysql://user[:password]@h1:3306,h2:3307/db[?connect_timeout=2&…]`. The
//! driver takes one host; the store tries each in order (each within `connect_timeout`
//! seconds, default [`DEFAULT_CONNECT_TIMEOUT_SECS`]) and keeps the first whose
//! `@@global.read_only` is 0 (see `store/connect.rs`).
//!
//! Error messages name `database.url` and the host list, never the user information.

use std::fmt;
use std::time::Duration;

use super::value::{ConfigError, invalid};

/// Seconds a connection attempt to one host may take when the URL does not say.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 2;

const KEY: &str = "database.url";

/// One server of the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for HostPort {
    /// `host:port`, an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// `scheme://[userinfo@]hosts[/path][?query][#…]`, split without decoding.
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    hosts: &'a str,
    /// With its leading `/`, or empty.
    path: &'a str,
    query: Option<&'a str>,
}

fn split(url: &str) -> Result<Parts<'_>, ConfigError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(KEY, "is not a URL (scheme://…)"))?;
    let rest = rest.split('#').next().unwrap_or("");
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    // The authority ends at the first `/` (a password holding `/` must be percent-encoded,
    // as in any URL); the user information at its last `@`.
    let path_start = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..path_start];
    let path = &rest[path_start..];
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    Ok(Parts {
        scheme,
        userinfo,
        hosts,
        path,
        query,
    })
}

/// Every `host[:port]` of a comma-separated list; a missing port is `default_port`.
pub fn parse_hosts(hosts: &str, default_port: u16) -> Result<Vec<HostPort>, ConfigError> {
    let mut found = Vec::new();
    for (i, chunk) in hosts.split(',').enumerate() {
        let bad = |why: &str| {
            invalid(
                KEY,
                format!("host {} of \"{hosts}\" ({chunk:?}) {why}", i + 1),
            )
        };
        let (host, port) = match chunk.strip_prefix('[') {
            Some(v6) => {
                let (h, rest) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("has no closing `]`"))?;
                match rest {
                    "" => (h, None),
                    _ => (
                        h,
                        Some(
                            rest.strip_prefix(':')
                                .ok_or_else(|| bad("is not host:port"))?,
                        ),
                    ),
                }
            }
            None => match chunk.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (chunk, None),
            },
        };
        if host.is_empty() {
            return Err(bad("has no host name"));
        }
        if host
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '/' | '?' | '@' | '[' | ']'))
        {
            return Err(bad("is not a host name"));
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => return Err(bad("has no valid port (1-65535)")),
            },
        };
        found.push(HostPort {
            host: host.to_owned(),
            port,
        });
    }
    Ok(found)
}

/// The query's `key=value` pairs, undecoded.
fn pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// `connect_timeout`: whole seconds, at least 1.
fn connect_timeout(value: &str) -> Result<u64, ConfigError> {
    match value.parse::<u64>() {
        Ok(secs) if (1..=3600).contains(&secs) => Ok(secs),
        _ => Err(invalid(
            KEY,
            "connect_timeout must be whole seconds between 1 and 3600",
        )),
    }
}

/// A PostgreSQL URL checked, with `connect_timeout` added when it has none.
pub fn postgres(url: &str) -> Result<String, ConfigError> {
    let parts = split(url)?;
    // No host: libpq's default (or `host=` in the query), as before.
    let hosts = if parts.hosts.is_empty() {
        Vec::new()
    } else {
        parse_hosts(parts.hosts, 5432)?
    };
    let mut attrs = None;
    let mut has_timeout = false;
    for (key, value) in pairs(parts.query) {
        match key {
            "target_session_attrs" => {
                if !matches!(value, "any" | "read-write" | "read-only") {
                    return Err(invalid(
                        KEY,
                        format!(
                            "target_session_attrs={value:?} is not one of any, read-write, read-only"
                        ),
                    ));
                }
                attrs = Some(value);
            }
            "connect_timeout" => {
                connect_timeout(value)?;
                has_timeout = true;
            }
            _ => {}
        }
    }
    if attrs == Some("read-only") {
        return Err(invalid(
            KEY,
            "target_session_attrs=read-only: paynotify writes; use read-write",
        ));
    }
    if hosts.len() > 1 && attrs != Some("read-write") {
        return Err(invalid(
            KEY,
            "lists several hosts: add target_session_attrs=read-write, or a standby may be chosen",
        ));
    }
    if has_timeout {
        return Ok(url.to_owned());
    }
    let (base, fragment) = url
        .split_once('#')
        .map_or((url, None), |(b, f)| (b, Some(f)));
    let separator = match parts.query {
        None => "?",
        Some("") => "",
        Some(_) => "&",
    };
    let mut with = format!("{base}{separator}connect_timeout={DEFAULT_CONNECT_TIMEOUT_SECS}");
    if let Some(fragment) = fragment {
        with.push('#');
        with.push_str(fragment);
    }
    Ok(with)
}

/// The servers of a MySQL URL, each as a URL the driver takes.
#[derive(Clone, PartialEq, Eq)]
pub struct MysqlTargets {
    /// In the order written: the first writable one is used.
    pub servers: Vec<(HostPort, String)>,
    /// Per host.
    pub connect_timeout: Duration,
}

impl fmt::Debug for MysqlTargets {
    /// The hosts only; never a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self.servers.iter().map(|(h, _)| h.to_string()).collect();
        write!(f, "MysqlTargets({})", hosts.join(","))
    }
}

impl MysqlTargets {
    /// Checks `url` and splits it into one URL per host; `connect_timeout` is taken out of
    /// the query (the driver does not know it).
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let parts = split(url)?;
        if parts.hosts.is_empty() {
            return Err(invalid(KEY, "a mysql:// URL needs a host"));
        }
        let hosts = parse_hosts(parts.hosts, 3306)?;
        let mut timeout = DEFAULT_CONNECT_TIMEOUT_SECS;
        let mut kept = Vec::new();
        for (key, value) in pairs(parts.query) {
            if key == "connect_timeout" {
                timeout = connect_timeout(value)?;
            } else if value.is_empty() {
                kept.push(key.to_owned());
            } else {
                kept.push(format!("{key}={value}"));
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let userinfo = parts.userinfo.map_or(String::new(), |u| format!("{u}@"));
        let servers = hosts
            .into_iter()
            .map(|host| {
                let one = format!("{}://{userinfo}{host}{}{query}", parts.scheme, parts.path);
                (host, one)
            })
            .collect();
        Ok(Self {
            servers,
            connect_timeout: Duration::from_secs(timeout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(result: Result<impl std::fmt::Debug, ConfigError>) -> String {
        let e = result.expect_err("refused").to_string();
        assert!(e.contains("database.url"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
        e
    }

    #[test]
    fn a_postgres_url_with_several_hosts_is_kept_and_gets_a_connect_timeout() {
        let url = "postgres://app:SECRET@h1:5432,h2:5433/pay?target_session_attrs=read-write";
        assert_eq!(
            postgres(url).expect("valid"),
            format!("{url}&connect_timeout={DEFAULT_CONNECT_TIMEOUT_SECS}")
        );
        let own =
            "postgres://u@h1,[::1]:6000/pay?target_session_attrs=read-write&connect_timeout=5";
        assert_eq!(postgres(own).expect("valid"), own);
        assert_eq!(
            postgres("postgres://u@h/db").expect("valid"),
            "postgres://u@h/db?connect_timeout=2"
        );
        assert_eq!(
            postgres("postgresql:///db").expect("no host: libpq's default"),
            "postgresql:///db?connect_timeout=2"
        );
        let hosts = parse_hosts("h1,[::1]:6000,h3:7", 5432).expect("hosts");
        let shown: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["h1:5432", "[::1]:6000", "h3:7"]);
    }

    #[test]
    fn a_bad_postgres_url_is_refused_naming_the_key_and_never_the_password() {
        let e = error(postgres(
            "postgres://app:SECRET@h1:5432,h2:54x/pay?target_session_attrs=read-write",
        ));
        assert!(e.contains("host 2") && e.contains("port"), "{e}");
        error(postgres(
            "postgres://app:SECRET@h1:5432,:5/pay?target_session_attrs=read-write",
        ));
        error(postgres("postgres://app:SECRET@h1:70000/pay"));
        let e = error(postgres("postgres://app:SECRET@h1,h2/pay"));
        assert!(e.contains("target_session_attrs=read-write"), "{e}");
        let e = error(postgres(
            "postgres://app:SECRET@h1,h2/pay?target_session_attrs=primary",
        ));
        assert!(e.contains("primary"), "{e}");
        error(postgres(
            "postgres://app:SECRET@h1/pay?target_session_attrs=read-only",
        ));
        error(postgres("postgres://app:SECRET@h1/pay?connect_timeout=0"));
        error(postgres(
            "postgres://app:SECRET@h1/pay?connect_timeout=soon",
        ));
        // A password holding `@`, `:` and `,` is user information, not a host.
        assert!(postgres("postgres://app:S,E:C@RET@h1/pay").is_ok());
    }

    #[test]
    fn a_mysql_url_is_split_into_one_url_per_host_in_order() {
        let t = MysqlTargets::parse("mysql://app:SECRET@h1:3306,h2:3307/pay?connect_timeout=3")
            .expect("valid");
        let urls: Vec<&str> = t.servers.iter().map(|(_, u)| u.as_str()).collect();
        assert_eq!(
            urls,
            [
                "mysql://app:SECRET@h1:3306/pay",
                "mysql://app:SECRET@h2:3307/pay"
            ]
        );
        assert_eq!(t.connect_timeout, Duration::from_secs(3));
        assert!(!format!("{t:?}").contains("SECRET"));
        let one = MysqlTargets::parse("mysql://root@127.0.0.1:3306/db?pool_min=1").expect("one");
        assert_eq!(one.servers.len(), 1);
        assert_eq!(
            one.servers[0].1,
            "mysql://root@127.0.0.1:3306/db?pool_min=1"
        );
        assert_eq!(
            one.connect_timeout,
            Duration::from_secs(DEFAULT_CONNECT_TIMEOUT_SECS)
        );
        let default_port = MysqlTargets::parse("mysql://u@db/x").expect("valid");
        assert_eq!(default_port.servers[0].0.to_string(), "db:3306");
    }

    #[test]
    fn a_bad_mysql_url_is_refused_naming_the_key_and_never_the_password() {
        error(MysqlTargets::parse("mysql://app:SECRET@h1:3306,h2:x/pay"));
        error(MysqlTargets::parse("mysql://app:SECRET@h1,,h2/pay"));
        error(MysqlTargets::parse("mysql://app:SECRET@/pay"));
        error(MysqlTargets::parse(
            "mysql://app:SECRET@h1/pay?connect_timeout=-1",
        ));
    }
}
