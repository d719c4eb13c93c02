//! Talking to the lab engine by hand: tagged prompt words and curl with its status.

use std::process::Command;

/// `n` distinct words (one token each) tagged so prompts do not share prefixes by accident.
pub fn words(n: usize, tag: &str) -> String {
    (0..n)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs curl with the given arguments and returns (status line code, body).
pub fn curl_status(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-m", "60", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl must be installed (Debian package curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text
        .rsplit_once('\n')
        .expect("curl -w prints the status last");
    (code.trim().parse().unwrap_or(0), body.to_string())
}
