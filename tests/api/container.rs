//! The container files say what the README promises. No engine here: these are checks of
//! the text (`docker-compose config` validates the compose file where it is installed).

const COMPOSE: &str = include_str!("../../docker-compose.yml");
const DOCKERFILE: &str = include_str!("../../Dockerfile");

/// The lines of one top-level service of the compose file.
fn service<'a>(name: &str) -> Vec<&'a str> {
    COMPOSE
        .lines()
        .skip_while(|l| l.trim_end() != format!("  {name}:"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    ") || l.trim_start().starts_with('#'))
        .collect()
}

#[test]
fn compose_runs_paynotify_on_all_interfaces_with_an_env_token_the_redis_gate_and_a_healthcheck() {
    let paynotify = service("paynotify").join("\n");
    assert!(paynotify.contains(r#"PAYNOTIFY__SERVER__LISTEN: "0.0.0.0:8080""#));
    assert!(paynotify.contains(r#"PAYNOTIFY__SERVER__API_TOKEN: "${PAYNOTIFY_API_TOKEN:?"#));
    let redis_url = service("paynotify")
        .into_iter()
        .find(|l| l.contains("PAYNOTIFY__REDIS__URL"))
        .expect("the Redis gate's URL");
    assert!(
        !redis_url.trim_start().starts_with('#'),
        "enabled: {redis_url}"
    );
    assert!(paynotify.contains("healthcheck:") && paynotify.contains("/readyz"));
}

#[test]
fn the_image_caches_dependencies_checks_readyz_and_runs_as_a_user() {
    let dummy = DOCKERFILE
        .find("echo 'fn main() {}' > src/main.rs")
        .expect("a dependency layer built on a dummy main");
    let sources = DOCKERFILE.find("COPY . .").expect("the sources copied");
    assert!(
        dummy < sources,
        "dependencies are built before the sources are copied"
    );
    assert!(DOCKERFILE.contains("HEALTHCHECK") && DOCKERFILE.contains("/readyz"));
    assert!(DOCKERFILE.contains("USER paynotify"));
}
