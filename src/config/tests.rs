//! The settings' tests: loading, environment overrides and every start-up error naming
//! its key.

use super::*;
use std::io::Write;

/// Settings from `contents` as a file and `env` as the environment.
pub(super) fn load(contents: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(contents.as_bytes()).expect("write temp file");
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Settings::load_from(f.path(), env)
}

#[test]
fn the_shipped_default_file_loads() {
    let s = Settings::load_from(Path::new(DEFAULT_CONFIG_FILE), HashMap::new())
        .expect("config/default.toml must load");
    assert_eq!(
        DatabaseUrl::parse(s.database.url.expose()).expect("url"),
        DatabaseUrl::Sqlite("data/paynotify.db".into())
    );
    assert!(s.server.listen.ip().is_loopback());
    assert!(s.redis.url.is_empty());
    assert_eq!(s.relay.sink, SinkKind::Log);
}

#[test]
fn an_unknown_key_is_named() {
    let err = load("[server]\nlisen = \"127.0.0.1:1\"\n", &[]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("server") && msg.contains("lisen"), "{msg}");
}

#[test]
fn an_unknown_section_is_named() {
    let err = load("[serverr]\nlisten = \"127.0.0.1:1\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("serverr"), "{err}");
}

#[test]
fn receipt_settings_default_to_rejected_for_a_week_and_bad_ones_name_their_key() {
    let s = load("", &[]).expect("defaults");
    assert_eq!(
        (s.receipts.store, s.receipts.keep_days, s.receipts.queue),
        (ReceiptMode::Rejected, 7, 1024)
    );
    assert_eq!(
        (
            s.receipts.anonymous_bytes_per_minute,
            s.receipts.anonymous_per_peer_per_minute,
            s.receipts.junk_prefix_bytes
        ),
        (1_048_576, 30, 256)
    );
    assert_eq!(
        (
            s.receipts.keyed_bytes_per_minute,
            s.receipts.unknown_key_bytes_per_minute
        ),
        (1_048_576, 1_048_576)
    );
    let s = load("[receipts]\nstore = \"all\"\nkeep_days = 30\n", &[]).expect("all");
    assert_eq!(
        (s.receipts.store, s.receipts.keep_days),
        (ReceiptMode::All, 30)
    );
    for (toml, key) in [
        ("[receipts]\nstore = \"some\"\n", "receipts.store"),
        ("[receipts]\nkeep_days = 0\n", "receipts.keep_days"),
        ("[receipts]\nqueue = 0\n", "receipts.queue"),
        (
            "[receipts]\nanonymous_bytes_per_minute = 2000000000\n",
            "receipts.anonymous_bytes_per_minute",
        ),
        (
            "[receipts]\nanonymous_per_peer_per_minute = 2000000\n",
            "receipts.anonymous_per_peer_per_minute",
        ),
        (
            "[receipts]\njunk_prefix_bytes = 100000\n",
            "receipts.junk_prefix_bytes",
        ),
        (
            "[receipts]\nkeyed_bytes_per_minute = 2000000000\n",
            "receipts.keyed_bytes_per_minute",
        ),
        (
            "[receipts]\nunknown_key_bytes_per_minute = 2000000000\n",
            "receipts.unknown_key_bytes_per_minute",
        ),
    ] {
        let err = load(toml, &[]).unwrap_err();
        assert!(err.to_string().contains(key), "{toml}: {err}");
    }
}

#[test]
fn a_bad_value_names_its_key() {
    let err = load("[database]\npool_size = \"many\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("database.pool_size"), "{err}");
    let err = load("[server]\nlisten = \"nowhere\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("server.listen"), "{err}");
    let err = load("[relay]\nsink = \"kafka\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("relay.sink"), "{err}");
    let err = load("[retention]\nkeep_days = 1\n", &[]).unwrap_err();
    assert!(err.to_string().contains("retention.keep_days"), "{err}");
    let err = load("[retention]\nevery_secs = 59\n", &[]).unwrap_err();
    assert!(err.to_string().contains("retention.every_secs"), "{err}");
    let err = load("[retention]\norders_keep_days = 365\n", &[]).unwrap_err();
    assert!(
        err.to_string().contains("retention.orders_keep_days"),
        "{err}"
    );
    let err = load("[bills]\nrun_at = \"25:00\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("bills.run_at"), "{err}");
    let err = load("[bills]\ntimezone = \"Mars/Olympus\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("bills.timezone"), "{err}");
    let err = load("[retention]\narchive_dir = \"\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("retention.archive_dir"), "{err}");
    let err = load("[retention]\nbill_items_keep_days = 29\n", &[]).unwrap_err();
    assert!(
        err.to_string().contains("retention.bill_items_keep_days"),
        "{err}"
    );
    let err = load("[retention]\nbill_lines_keep_days = 7\n", &[]).unwrap_err();
    assert!(
        err.to_string().contains("retention.bill_lines_keep_days"),
        "{err}"
    );
    let err = load("[server]\nbody_timeout_ms = 0\n", &[]).unwrap_err();
    assert!(err.to_string().contains("server.body_timeout_ms"), "{err}");
    let err = load("[database]\nurl = \"oracle://x\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("database.url"), "{err}");
}

#[test]
fn environment_overrides_the_file_with_double_underscores() {
    let s = load(
        "[database]\npool_size = 4\n",
        &[
            ("PAYNOTIFY__DATABASE__POOL_SIZE", "9"),
            ("PAYNOTIFY__SERVER__API_TOKEN", "t0ken"),
            ("PAYNOTIFY_DATABASE_POOL_SIZE", "3"),
        ],
    )
    .expect("loads");
    assert_eq!(s.database.pool_size, 9);
    assert_eq!(s.server.api_token.expose(), "t0ken");
}

#[test]
fn string_settings_from_the_environment_keep_their_exact_bytes() {
    for value in [
        "00012345", "9e9", "True", "false", "1.50", "0x10", "-0", " 7 ", "1e3",
    ] {
        let s = load(
            "",
            &[
                ("PAYNOTIFY__SERVER__API_TOKEN", value),
                ("PAYNOTIFY__RELAY__HTTP_SECRET", value),
                ("PAYNOTIFY__REDIS__KEY_PREFIX", value),
                ("PAYNOTIFY__RELAY__REDIS_STREAM", value),
            ],
        )
        .unwrap_or_else(|e| panic!("{value:?}: {e}"));
        assert_eq!(s.server.api_token.expose(), value);
        assert_eq!(s.relay.http_secret.expose(), value);
        assert_eq!(s.redis.key_prefix, value);
        assert_eq!(s.relay.redis_stream, value);
    }
}

#[test]
fn numbers_and_booleans_from_the_environment_still_parse() {
    let s = load(
        "",
        &[
            ("PAYNOTIFY__SERVER__MAX_BODY_BYTES", "2048"),
            ("PAYNOTIFY__DATABASE__AUTO_MIGRATE", "false"),
            ("PAYNOTIFY__DATABASE__POOL_SIZE", "3"),
            ("PAYNOTIFY__RELAY__INTERVAL_MS", "250"),
            ("PAYNOTIFY__RELAY__SINK", "http"),
            ("PAYNOTIFY__RELAY__HTTP_URL", "http://127.0.0.1:1/hook"),
            ("PAYNOTIFY__RELAY__HTTP_SECRET", "s"),
            ("PAYNOTIFY__SERVER__LISTEN", "127.0.0.1:9"),
        ],
    )
    .expect("loads");
    assert_eq!(s.server.max_body_bytes, 2048);
    assert!(!s.database.auto_migrate);
    assert_eq!(s.database.pool_size, 3);
    assert_eq!(s.relay.interval_ms, 250);
    assert_eq!(s.relay.sink, SinkKind::Http);
    assert_eq!(s.server.listen.port(), 9);
    let err = load("", &[("PAYNOTIFY__DATABASE__POOL_SIZE", "many")]).unwrap_err();
    assert!(err.to_string().contains("database.pool_size"), "{err}");
    let err = load("", &[("PAYNOTIFY__DATABASE__AUTO_MIGRATE", "maybe")]).unwrap_err();
    assert!(err.to_string().contains("database.auto_migrate"), "{err}");
}

#[test]
fn group_apply_max_is_off_at_zero_and_bounded() {
    let on = load("", &[]).expect("default");
    assert_eq!(on.database.group_apply_max, 64);
    let off = load("[database]\ngroup_apply_max = 0\n", &[]).expect("0 turns it off");
    assert_eq!(off.database.group_apply_max, 0);
    for bad in [
        "[database]\ngroup_apply_max = 1001\n",
        "[database]\ngroup_apply_max = -1\n",
    ] {
        let err = load(bad, &[]).unwrap_err();
        assert!(
            err.to_string().contains("database.group_apply_max"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn thread_counts_resolve_zero_and_are_bounded() {
    let auto = load("", &[]).expect("default");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(auto.server.http_workers(), cores);
    assert_eq!(auto.server.runtime_threads(), (cores / 4).max(1));
    let set = load("[server]\nworkers = 3\nio_threads = 5\n", &[]).expect("set");
    assert_eq!(
        (set.server.http_workers(), set.server.runtime_threads()),
        (3, 5)
    );
    for (bad, key) in [
        ("[server]\nworkers = 1025\n", "server.workers"),
        ("[server]\nio_threads = 1025\n", "server.io_threads"),
        ("[server]\nio_threads = -1\n", "server.io_threads"),
    ] {
        let err = load(bad, &[]).unwrap_err();
        assert!(err.to_string().contains(key), "{bad}: {err}");
    }
}

#[test]
fn recent_answers_default_to_100000_and_are_bounded() {
    let on = load("", &[]).expect("default");
    assert_eq!(on.redis.recent_answers, 100_000);
    let off = load("[redis]\nrecent_answers = 0\n", &[]).expect("0 keeps none");
    assert_eq!(off.redis.recent_answers, 0);
    let err = load("[redis]\nrecent_answers = 10000001\n", &[]).unwrap_err();
    assert!(err.to_string().contains("redis.recent_answers"), "{err}");
}

#[test]
fn an_in_memory_sqlite_database_is_refused_naming_database_url() {
    for url in [
        "sqlite://:memory:",
        "sqlite://:MEMORY:",
        "sqlite::memory:",
        "sqlite://file::memory:",
        "sqlite://file::memory:?cache=shared",
        "sqlite://file:pay.db?mode=memory",
        "sqlite://file:pay.db?cache=shared&mode=memory",
        "sqlite://file:?cache=shared",
    ] {
        let err = DatabaseUrl::parse(url).unwrap_err().to_string();
        assert!(err.contains("database.url"), "{url}: {err}");
        assert!(err.contains("in-memory"), "{url}: {err}");
        let toml = format!("[database]\nurl = \"{url}\"\n");
        let err = load(&toml, &[]).unwrap_err().to_string();
        assert!(err.contains("database.url"), "{url}: {err}");
    }
    for file in [
        "sqlite://data/pay.db",
        "sqlite:///var/lib/pay.db",
        "sqlite://file:pay.db?mode=rwc",
        "sqlite://memory.db",
    ] {
        assert!(
            matches!(DatabaseUrl::parse(file), Ok(DatabaseUrl::Sqlite(_))),
            "{file}"
        );
    }
}

#[test]
fn an_unknown_environment_key_is_named() {
    let err = load("", &[("PAYNOTIFY__DATABASE__POOLSIZE", "9")]).unwrap_err();
    assert!(err.to_string().contains("poolsize"), "{err}");
}

/// Found by the `config` fuzz target: an empty field name (`"" = 1`, or a variable named
/// just `PAYNOTIFY__`) was reported as ``config key ``: unknown field `` `` ``.
#[test]
fn an_empty_key_is_reported_at_its_parent() {
    // The file, the variables, the key named, words of the message.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 4] = [
        ("", &[("PAYNOTIFY__", "")], ".", "PAYNOTIFY__"),
        ("\"\" = 1\n", &[], ".", "unknown field ``"),
        ("[server]\n\"\" = 1\n", &[], "server", "unknown field ``"),
        (
            "",
            &[("PAYNOTIFY__SERVER__", "x")],
            "server.",
            "PAYNOTIFY__SERVER__",
        ),
    ];
    for (file, env, want_key, want_message) in cases {
        match load(file, env) {
            Err(ConfigError::Invalid { key, message }) => {
                assert_eq!(key, want_key, "{file:?} {env:?}: {message}");
                assert!(
                    message.contains(want_message),
                    "{file:?} {env:?}: {message}"
                );
            }
            other => panic!("{file:?} {env:?}: {other:?}"),
        }
    }
}

#[test]
fn an_empty_token_is_refused_off_loopback() {
    let err = load("[server]\nlisten = \"0.0.0.0:8080\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("server.api_token"), "{err}");
    load(
        "[server]\nlisten = \"0.0.0.0:8080\"\napi_token = \"x\"\n",
        &[],
    )
    .expect("a token makes a public address acceptable");
    load("[server]\nlisten = \"[::1]:8080\"\n", &[]).expect("IPv6 loopback is loopback");
}

#[test]
fn a_plain_http_console_is_allowed_on_loopback_only() {
    let s = load("", &[]).expect("defaults");
    assert!(!s.server.console_plain_http, "Secure by default");
    let err = load(
        "[server]\nlisten = \"0.0.0.0:8080\"\napi_token = \"x\"\nconsole_plain_http = true\n",
        &[],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("server.console_plain_http"),
        "{err}"
    );
    let s = load("[server]\nconsole_plain_http = true\n", &[]).expect("on loopback");
    assert!(s.server.console_plain_http);
}

#[test]
fn secrets_never_show_in_debug_output() {
    let s = load(
        r#"
[server]
api_token = "tok-SECRET-1"
[database]
url = "postgres://app:pw-SECRET-2@db/pay"
[relay]
http_secret = "hmac-SECRET-3"
[[wechat.merchants]]
mchid = "1900000001"
appid = "wx1"
apiv3_key = "0123456789abcdef0123456789SECRET"
"#,
        &[],
    )
    .expect("loads");
    let shown = format!("{s:?}");
    assert!(!shown.contains("SECRET"), "{shown}");
    let url = DatabaseUrl::parse(s.database.url.expose()).expect("url");
    assert!(!format!("{url:?}").contains("SECRET"));
}

#[test]
fn a_wrong_length_apiv3_key_is_named() {
    let err = load(
        "[[wechat.merchants]]\nmchid = \"1\"\nappid = \"a\"\napiv3_key = \"short\"\n",
        &[],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("wechat.merchants[0].apiv3_key"),
        "{err}"
    );
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let err = load("", &[("PAYNOTIFY__SERVER__LISTEN", "nowhere")]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("server.listen"), "{msg}");
    assert!(
        msg.contains("environment variable PAYNOTIFY__SERVER__LISTEN"),
        "{msg}"
    );
    let err = load("", &[("PAYNOTIFY__DATABASE__POOLSIZE", "9")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("environment variable PAYNOTIFY__DATABASE__POOLSIZE"),
        "{err}"
    );
    // A check that runs after parsing names the variable too.
    let err = load("", &[("PAYNOTIFY__RETENTION__KEEP_DAYS", "1")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("environment variable PAYNOTIFY__RETENTION__KEEP_DAYS"),
        "{err}"
    );
    // The same mistake in the file says nothing about the environment.
    let err = load("[server]\nlisten = \"nowhere\"\n", &[]).unwrap_err();
    assert!(!err.to_string().contains("environment"), "{err}");
}

#[test]
fn variables_that_configure_nothing_are_reported_with_the_right_spelling() {
    let vars = [
        ("PAYNOTIFY_SERVER_LISTEN", "0.0.0.0:9"),
        ("PAYNOTIFY__SERVER__LISTEN", "127.0.0.1:9"),
        ("PAYNOTIFY_CONFIG", "x.toml"),
        ("PAYNOTIFY__SERVER", "x"),
        ("PAYNOTIFYX", "x"),
        ("HOME", "/root"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let warnings = unused_env_vars(vars);
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("PAYNOTIFY_SERVER_LISTEN is ignored")
                && w.contains("did you mean PAYNOTIFY__SERVER__LISTEN?")),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("PAYNOTIFY__SERVER is")),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("PAYNOTIFYX is")),
        "{warnings:#?}"
    );
}

#[test]
fn log_format_is_text_unless_json_is_asked_for() {
    assert_eq!(load("", &[]).expect("loads").log.format, LogFormat::Text);
    let s = load("[log]\nformat = \"json\"\n", &[]).expect("loads");
    assert_eq!(s.log.format, LogFormat::Json);
    let s = load("", &[("PAYNOTIFY__LOG__FORMAT", "json")]).expect("loads");
    assert_eq!(s.log.format, LogFormat::Json);
    let err = load("[log]\nformat = \"xml\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("log.format"), "{err}");
}

#[test]
fn the_stream_sink_takes_relay_redis_url_before_redis_url() {
    let stream_url = |s: &Settings| match s.relay.stream_target(&s.redis).expect("target") {
        (key, RedisTarget::Nodes(RedisNodes::Single(url))) => (key, url),
        (key, other) => panic!("{key}: {other:?}"),
    };
    let s = load(
        "[redis]\nurl = \"redis://gate:6379\"\n[relay]\nsink = \"redis-stream\"\nredis_url = \"redis://events:6380\"\n",
        &[],
    )
    .expect("loads");
    assert_eq!(
        stream_url(&s),
        ("relay.redis_url", "redis://events:6380".to_owned())
    );
    let s = load(
        "[relay]\nsink = \"redis-stream\"\n",
        &[("PAYNOTIFY__RELAY__REDIS_URL", "redis://events:6380")],
    )
    .expect("a stream sink needs no gate");
    assert_eq!(stream_url(&s).1, "redis://events:6380");
    let s = load(
        "[redis]\nurl = \"redis://gate:6379\"\n[relay]\nsink = \"redis-stream\"\n",
        &[],
    )
    .expect("loads");
    assert_eq!(stream_url(&s).0, "redis.url");
    let err = load("[relay]\nsink = \"redis-stream\"\n", &[]).unwrap_err();
    assert!(err.to_string().contains("relay.redis_url"), "{err}");
    let err = load(
        "[relay]\nsink = \"redis-stream\"\nredis_url = \"redis+cluster://a:7000,b:7001\"\n",
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("relay.redis_url"), "{err}");
}

#[test]
fn redis_url_names_one_node_or_a_cluster() {
    assert_eq!(
        RedisNodes::parse("redis://127.0.0.1:6379/0").expect("single"),
        RedisNodes::Single("redis://127.0.0.1:6379/0".into())
    );
    let cluster =
        |nodes: &[&str]| RedisNodes::Cluster(nodes.iter().map(|n| (*n).to_owned()).collect());
    assert_eq!(
        RedisNodes::parse("redis+cluster://10.0.0.1:7000").expect("one seed"),
        cluster(&["redis://10.0.0.1:7000"])
    );
    assert_eq!(
        RedisNodes::parse("redis+cluster://:pw@a:7000,b:7001").expect("seeds"),
        cluster(&["redis://:pw@a:7000", "redis://:pw@b:7001"])
    );
    assert_eq!(
        RedisNodes::parse("redis://a:7000, redis://b:7001,c:7002").expect("list"),
        cluster(&["redis://a:7000", "redis://b:7001", "redis://c:7002"])
    );
    for bad in [
        "rediss://a:1",
        "http://a",
        "redis://a:1,,b:2",
        "redis://a:1,http://b:2",
    ] {
        let err = RedisNodes::parse(bad).unwrap_err().to_string();
        assert!(err.contains("redis.url"), "{bad}: {err}");
    }
    let err = load(
        "[redis]\nurl = \"redis+cluster://a:7000,b:7001\"\n[relay]\nsink = \"redis-stream\"\n",
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("redis.url"), "{err}");
    assert!(
        !format!(
            "{:?}",
            RedisNodes::parse("redis+cluster://:SECRET@a:1").expect("ok")
        )
        .contains("SECRET")
    );
}

#[test]
fn a_missing_file_is_named() {
    let err = Settings::load_from(Path::new("/nonexistent/p.toml"), HashMap::new()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/p.toml"), "{err}");
}
