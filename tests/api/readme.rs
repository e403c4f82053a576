//! The README is the newcomer's contract: every ```sh block in it runs, in order, as a
//! script (`set -e -o pipefail`) in a fresh folder that holds a copy of `config/`, with the
//! `paynotify` this test was built with first on `PATH`. Blocks marked
//! `<!-- readme-test: skip (why) -->` on the line before are not run (building, the test
//! suite itself, example values). Two substitutions keep parallel runs apart: the ports
//! 8080 and 8081 become free ports, in the blocks and in the copied default config.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::helpers::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_paynotify");
/// The longest any one block may run.
const BLOCK_LIMIT: Duration = Duration::from_secs(90);

/// `(line number, script)` of every ```sh block not marked skip.
fn sh_blocks(readme: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut previous = "";
    let mut current: Option<(usize, String)> = None;
    for (i, line) in readme.lines().enumerate() {
        match &mut current {
            Some(_) if line.trim_start() == "```" => {
                if let Some(block) = current.take() {
                    blocks.push(block);
                }
            }
            Some((_, script)) => {
                script.push_str(line);
                script.push('\n');
            }
            None if line.trim() == "```sh" && !previous.contains("readme-test: skip") => {
                current = Some((i + 1, String::new()));
            }
            None => {}
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    blocks
}

/// Every process group a block started; SIGTERM to each when the test ends, pass or fail
/// (the blocks leave `paynotify serve &` running, as a newcomer's terminal would).
struct Groups(Vec<u32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for pgid in &self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn copy_config(from: &Path, to: &Path, port: u16) {
    std::fs::create_dir_all(to).expect("config dir");
    for entry in std::fs::read_dir(from).expect("config/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("config file");
        let text = text.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
        std::fs::write(to.join(path.file_name().expect("name")), text).expect("write config");
    }
}

#[test]
fn every_readme_sh_block_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = sh_blocks(&readme);
    assert!(
        blocks.len() >= 4,
        "the README's runnable blocks were found: {blocks:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (main_port, sandbox_port) = (free_port(), free_port());
    copy_config(&root.join("config"), &dir.path().join("config"), main_port);
    let bin_dir = Path::new(BIN).parent().expect("binary dir");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut groups = Groups(Vec::new());
    for (line, script) in blocks {
        let script = script
            .replace("8080", &main_port.to_string())
            .replace("8081", &sandbox_port.to_string());
        let log = dir.path().join(format!("block-{line}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut child = Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c", &script])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("PAYNOTIFY_CONFIG")
            // `mktemp -d` in a block makes its folder inside this test's.
            .env("TMPDIR", dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .expect("bash runs");
        groups.0.push(child.id());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > BLOCK_LIMIT {
                let _ = child.kill();
                panic!(
                    "README block at line {line} ran longer than {BLOCK_LIMIT:?}:\n{script}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            status.success(),
            "README block at line {line} failed ({status}):\n{script}\n--- output ---\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
}

#[test]
fn blocks_marked_skip_are_left_out_and_the_rest_are_found() {
    let readme = "a\n```sh\necho one\n```\n<!-- readme-test: skip (x) -->\n```sh\nexit 1\n```\n\n```toml\nx = 1\n```\n```sh\necho two\n```\n";
    let blocks: Vec<String> = sh_blocks(readme).into_iter().map(|(_, s)| s).collect();
    assert_eq!(blocks, ["echo one\n", "echo two\n"]);
}
