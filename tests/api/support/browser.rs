//! A headless Chromium driven through chromedriver's WebDriver API (W3C, JSON over HTTP on
//! loopback): the few commands the console's browser tests use. Debian's `chromium` and
//! `chromium-driver`; `tests/run.sh` installs them when missing, and a test that finds no
//! chromedriver fails saying so.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use super::helpers::free_port;

/// The key W3C WebDriver names an element reference with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// One browser session; chromedriver and the browser end when it is dropped.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// Where a test's screenshots are kept (`target/tmp/console-screenshots/`).
pub fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir
}

impl Browser {
    pub async fn start() -> Self {
        assert!(
            Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
            "the console's browser tests need Debian's chromium and chromium-driver \
             (apt-get install chromium chromium-driver; tests/run.sh installs them)"
        );
        let port = free_port();
        // Its own process group: the browsers it starts end with it (see `Drop`).
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(r) = ready {
                let status: Value = r.json().await.unwrap_or_default();
                if status["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().expect("profile folder");
        // The flags a machine with a closed network needs (no background fetches) and a
        // root user needs (no sandbox).
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1360,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&json!({ "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            } } }))
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("new session answer");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        Self {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("webdriver")
            .json()
            .await
            .expect("webdriver answer");
        if answer["value"]["error"].is_string() {
            panic!("webdriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The elements `css` selects.
    pub async fn all(&self, css: &str) -> Vec<String> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
            .collect()
    }

    /// The one element `css` selects first.
    pub async fn find(&self, css: &str) -> String {
        self.all(css)
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no element {css:?} on the page"))
    }

    /// Waits (up to 20 s) for `css` to select something: a click that posts a form returns
    /// before the page it leads to has loaded.
    pub async fn wait_for(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.all(css).await.is_empty() {
            assert!(Instant::now() < deadline, "no element {css:?} within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::GET,
            &format!("/element/{element}/text"),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` in the page (WebDriver's own channel: the page's CSP does not apply).
    pub async fn script(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    /// A PNG of the viewport, written to `artefacts()/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or_default())
            .expect("screenshot base64");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = artefacts().join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }
}

impl Browser {
    /// Ends the session (the browser closes), then chromedriver.
    pub async fn quit(self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver and every browser it started, also after a failed assertion.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.wait();
    }
}
