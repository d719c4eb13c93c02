//! Packet loss on loopback with nftables (this kernel has no netem): a share of the
//! engine's data segments is dropped on the input hook, after the engine's TCP counted
//! them sent, so it retransmits them as after a loss on the wire. (Dropped on the output
//! hook, the send fails locally and TCP quietly re-sends without a retransmission.)
use std::io::Write;
use std::process::{Command, Stdio};

use super::ScenarioError;

/// Table names start with this, then the owning pid and the port.
const TABLE_PREFIX: &str = "tokenscope_lab_loss_";

/// An nftables table that drops one in `one_in` of the data segments a port sends;
/// deleted on drop.
pub(crate) struct SegmentDropper {
    table: String,
}

impl SegmentDropper {
    pub(super) fn install(port: u16, one_in: u32) -> Result<SegmentDropper, ScenarioError> {
        remove_stale_tables()?;
        let table = format!("{TABLE_PREFIX}{}_{port}", std::process::id());
        // Pure ACKs, even with SACK blocks, are at most 80 bytes; SYN/FIN/RST pass so the
        // connection opens and closes as usual.
        let script = format!(
            "table inet {table} {{\n\
             \tchain inbound {{\n\
             \t\ttype filter hook input priority 0; policy accept;\n\
             \t\ttcp sport {port} tcp flags & (fin | syn | rst) == 0 meta length > 80 \
             numgen random mod {one_in} == 0 counter drop\n\
             \t}}\n\
             }}\n"
        );
        nft(&["-f", "-"], Some(&script), "add the drop rule")?;
        Ok(SegmentDropper { table })
    }

    /// Segments dropped so far (the rule's counter).
    pub(super) fn dropped(&self) -> Result<u64, ScenarioError> {
        let listing = nft(
            &["list", "table", "inet", &self.table],
            None,
            "read the drop counter",
        )?;
        Ok(counter_packets(&listing).unwrap_or(0))
    }
}

impl Drop for SegmentDropper {
    fn drop(&mut self) {
        let _ = nft(
            &["delete", "table", "inet", &self.table],
            None,
            "delete the table",
        );
    }
}

/// Tables left by a lab process that died before its guard ran: their port may belong
/// to someone else by now.
fn remove_stale_tables() -> Result<(), ScenarioError> {
    let tables = nft(&["list", "tables"], None, "list tables")?;
    for name in stale_tables(&tables, |pid| {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }) {
        nft(
            &["delete", "table", "inet", &name],
            None,
            "delete a stale table",
        )?;
    }
    Ok(())
}

fn stale_tables(listing: &str, alive: impl Fn(u32) -> bool) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table inet "))
        .filter(|name| {
            name.strip_prefix(TABLE_PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|pid| pid.parse().ok())
                .is_some_and(|pid| !alive(pid))
        })
        .map(str::to_string)
        .collect()
}

fn counter_packets(listing: &str) -> Option<u64> {
    let rest = &listing[listing.find("counter packets ")? + "counter packets ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Runs nft; its first line of complaint becomes the error.
fn nft(args: &[&str], stdin: Option<&str>, action: &'static str) -> Result<String, ScenarioError> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ScenarioError::NftMissing,
            _ => ScenarioError::Nft {
                action,
                message: e.to_string(),
            },
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| ScenarioError::Nft {
                action,
                message: e.to_string(),
            })?;
    }
    let out = child.wait_with_output().map_err(|e| ScenarioError::Nft {
        action,
        message: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message = stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed without a message")
            .trim()
            .to_string();
        return Err(ScenarioError::Nft { action, message });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Segments the kernel retransmitted so far, all sockets (`Tcp: RetransSegs` in
/// /proc/net/snmp); None when the file cannot be read.
pub(crate) fn kernel_retransmits() -> Option<u64> {
    retrans_segs(&std::fs::read_to_string("/proc/net/snmp").ok()?)
}

fn retrans_segs(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == "RetransSegs")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmits_are_read_by_column_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs InErrs\n\
                    Tcp: 1 200 5000 42 0\n";
        assert_eq!(retrans_segs(snmp), Some(42), "RetransSegs column");
        assert_eq!(retrans_segs("Ip: 1\n"), None, "no Tcp lines, no count");
    }

    #[test]
    fn only_tables_of_dead_lab_processes_are_stale() {
        let listing = "table inet filter\ntable inet tokenscope_lab_loss_100_8000\n\
                       table inet tokenscope_lab_loss_200_8001\n";
        assert_eq!(
            stale_tables(listing, |pid| pid == 200),
            vec!["tokenscope_lab_loss_100_8000".to_string()],
            "the dead pid's table only, never foreign tables"
        );
    }

    #[test]
    fn drop_counter_is_parsed() {
        let listing = "table inet t {\n chain inbound {\n  tcp sport 8000 numgen random mod 10 0 \
                       counter packets 17 bytes 4000 drop\n }\n}\n";
        assert_eq!(counter_packets(listing), Some(17), "packets of the counter");
    }
}
