//! Two "hosts" on one machine: two network namespaces joined by a veth pair (root
//! only; iproute2's `ip` and `tc`).

use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Side A's address. The /24 lives only inside the two namespaces, so it cannot clash
/// with the host's routes; 10.213.7.0/24 also stays clear of the ranges Docker and
/// Kubernetes hand out, for whoever looks at both with `ip netns exec`.
pub const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 7, 1);
/// Side B's address, on the same /24.
pub const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 7, 2);
const PREFIX_LEN: u8 = 24;
/// The veth ends, named inside their namespaces (so parallel pairs never clash).
const VETH_A: &str = "veth-a";
const VETH_B: &str = "veth-b";
const NETNS_DIR: &str = "/run/netns";

/// One side of a [`NetnsPair`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// A network namespace made by `ip netns add`.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    pub addr: Ipv4Addr,
}

impl Netns {
    /// `/run/netns/<name>`, what `tokenscope record --netns` takes.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// The namespace's inode (the N of `net:[N]`), what the probes filter on.
    pub fn inode(&self) -> u64 {
        std::fs::metadata(self.path())
            .unwrap_or_else(|e| panic!("{} unreadable: {e}", self.path().display()))
            .ino()
    }

    /// `program` run inside the namespace (`ip netns exec <name> program`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

/// Two namespaces, A and B, joined by a veth pair: A_ADDR and B_ADDR reach each other,
/// and each has its loopback up. Dropping it deletes both (and so the veth pair).
#[derive(Debug)]
pub struct NetnsPair {
    pub a: Netns,
    pub b: Netns,
}

impl NetnsPair {
    /// Makes `ts-<tag>-<pid>-a` and `-b`, first deleting any `ts-<tag>-*` an earlier,
    /// killed run of the same tag left behind.
    pub fn new(tag: &str) -> io::Result<NetnsPair> {
        remove_stale(tag);
        let name = |side: &str| format!("ts-{tag}-{}-{side}", std::process::id());
        ip(&["netns", "add", &name("a")])?;
        let a = Netns {
            name: name("a"),
            addr: A_ADDR,
        };
        if let Err(e) = ip(&["netns", "add", &name("b")]) {
            delete(&a.name);
            return Err(e);
        }
        // From here on, a failure drops the pair, which deletes both.
        let pair = NetnsPair {
            a,
            b: Netns {
                name: name("b"),
                addr: B_ADDR,
            },
        };
        let (a, b) = (&pair.a.name, &pair.b.name);
        ip(&[
            "-n", a, "link", "add", VETH_A, "type", "veth", "peer", "name", VETH_B, "netns", b,
        ])?;
        for (ns, veth, addr) in [(a, VETH_A, A_ADDR), (b, VETH_B, B_ADDR)] {
            let cidr = format!("{addr}/{PREFIX_LEN}");
            ip(&["-n", ns, "addr", "add", &cidr, "dev", veth])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", veth, "up"])?;
        }
        Ok(pair)
    }

    /// Delays what `side` sends by `delay` (`tc qdisc add dev <its veth> root netem
    /// delay <d>`: egress only, so a round trip pays it once). Kernels built without
    /// CONFIG_NET_SCH_NETEM refuse it.
    pub fn netem(&self, side: Side, delay: Duration) -> io::Result<()> {
        let (ns, veth) = match side {
            Side::A => (&self.a.name, VETH_A),
            Side::B => (&self.b.name, VETH_B),
        };
        let delay = format!("{}us", delay.as_micros());
        run(Command::new("tc").args([
            "-n", ns, "qdisc", "add", "dev", veth, "root", "netem", "delay", &delay,
        ]))
        .map_err(|e| match e.to_string() {
            why if why.contains("qdisc kind is unknown") => io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{why} (this kernel was built without CONFIG_NET_SCH_NETEM)"),
            ),
            _ => e,
        })
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        delete(&self.a.name);
        delete(&self.b.name);
    }
}

/// `ts-<tag>-<pid>-{a,b}` of processes that are gone.
fn remove_stale(tag: &str) {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    let prefix = format!("ts-{tag}-");
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix("-a").or_else(|| rest.strip_suffix("-b")))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            delete(&name);
        }
    }
}

/// Never fails: a namespace already gone is what was wanted.
fn delete(name: &str) {
    let _ = ip(&["netns", "del", name]);
}

fn ip(args: &[&str]) -> io::Result<()> {
    run(Command::new("ip").args(args))
}

/// Runs a command to its end; its stderr in the error when it fails.
fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{cmd:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}
