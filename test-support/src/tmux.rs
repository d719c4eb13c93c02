//! A private tmux server (its own socket, no user config) to drive a binary in a
//! real terminal and read its screen. tmux has no event for "the screen changed",
//! so [`Tmux::wait_for`] polls the screen until it shows what is awaited.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The session every [`Tmux`] runs its one window in.
const SESSION: &str = "main";

pub struct Tmux {
    socket: String,
    /// How long [`Tmux::wait_for`] waits before it fails.
    patience: Duration,
    /// Lines above the visible screen that [`Tmux::screen`] includes.
    history: u32,
}

impl Tmux {
    /// Runs `command` in a `width` x `height` window of a new private server.
    pub fn start(width: u16, height: u16, command: &str) -> Tmux {
        // One server per call: tests of one binary run in parallel.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let socket = format!(
            "tokenscope-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let tmux = Tmux {
            socket,
            patience: Duration::from_secs(30),
            history: 0,
        };
        let (width, height) = (width.to_string(), height.to_string());
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            &width,
            "-y",
            &height,
            command,
        ]);
        tmux
    }

    /// A bash without rc files, prompt `shell$ `, ready for [`Tmux::type_text`].
    pub fn shell(width: u16, height: u16) -> Tmux {
        let tmux = Tmux::start(
            width,
            height,
            "env PS1='shell$ ' TERM=xterm-256color bash --norc --noprofile",
        );
        tmux.wait_for("the shell prompt", |s| s.contains("shell$"));
        tmux
    }

    /// Waits this long in [`Tmux::wait_for`] (30 s unless set).
    pub fn with_patience(mut self, patience: Duration) -> Tmux {
        self.patience = patience;
        self
    }

    /// Includes this many lines of scrollback in [`Tmux::screen`] (0 unless set).
    pub fn with_history(mut self, lines: u32) -> Tmux {
        self.history = lines;
        self
    }

    /// `tmux ARGS` on this server; its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running tmux (install the tmux package): {e}"));
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Key names as tmux knows them (`Enter`, `Escape`, `q`).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", SESSION];
        args.extend(keys);
        self.run(&args);
    }

    /// Typed literally (no key-name lookup).
    pub fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", SESSION, "-l", text]);
    }

    pub fn resize(&self, width: u16, height: u16) {
        let (width, height) = (width.to_string(), height.to_string());
        self.run(&["resize-window", "-t", SESSION, "-x", &width, "-y", &height]);
    }

    /// The screen as text (with the configured scrollback above it).
    pub fn screen(&self) -> String {
        let start = format!("-{}", self.history);
        self.run(&["capture-pane", "-p", "-t", SESSION, "-S", &start])
    }

    /// A tmux format of the pane, e.g. `#{alternate_on}`.
    pub fn pane_flag(&self, flag: &str) -> String {
        self.run(&["display-message", "-p", "-t", SESSION, flag])
            .trim()
            .to_string()
    }

    /// Polls the screen until `ready` holds; fails after the patience, showing it.
    pub fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + self.patience;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {:?} for {what}; the screen:\n{screen}",
                self.patience
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}
