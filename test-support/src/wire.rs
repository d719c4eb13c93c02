//! A delayed point-to-point link between two network namespaces, carried by this
//! process through a TUN device in each: a stand-in for `tc ... netem delay` on
//! kernels built without CONFIG_NET_SCH_NETEM. Packets pass untouched (no NAT, no
//! proxy), so both ends of a TCP connection see the same 4-tuple.

use std::collections::VecDeque;
use std::ffi::{c_char, c_short};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Side A's end of the link: a /24 apart from the veth pair's 10.213.7.0/24, so both
/// can live in the same namespaces.
pub const WIRE_A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 9, 1);
/// Side B's end.
pub const WIRE_B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 9, 2);
/// The TUN devices, named inside their namespaces (so parallel links never clash).
pub const TUN_A: &str = "tsw-a";
/// Side B's TUN device.
pub const TUN_B: &str = "tsw-b";
/// The largest packet a TUN read can return (the devices keep MTU 1500; GSO is off
/// without IFF_VNET_HDR, but a larger buffer costs nothing).
const READ_BUF: usize = 65536;
/// How often a carrier looks at the stop flag while its device is quiet.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags, padded to the
/// union's 24 bytes.
#[repr(C)]
struct IfreqFlags {
    name: [c_char; libc::IFNAMSIZ],
    flags: c_short,
    _pad: [u8; 22],
}
const _: () = assert!(std::mem::size_of::<IfreqFlags>() == 40);

/// A point-to-point IP link between two network namespaces through two TUN devices
/// and this process, each direction held for its own delay (a stand-in for netem).
/// Dropping it stops the carriers and closes the devices, which then vanish.
#[derive(Debug)]
pub struct DelayedLink {
    pub a_addr: Ipv4Addr,
    pub b_addr: Ipv4Addr,
    stop: Arc<AtomicBool>,
    /// One carrier per direction.
    threads: Vec<JoinHandle<()>>,
    /// What each carrier did, A to B first.
    logs: [Arc<Mutex<CarrierLog>>; 2],
}

/// What one direction's carrier did: how long it really held each packet, from the
/// moment it read the packet to the moment its write returned (the delay asked for
/// plus its own lateness), and whether it got the real-time priority it asks for.
#[derive(Debug, Default, Clone)]
pub struct CarrierLog {
    pub held: Vec<Duration>,
    pub punctual: bool,
}

impl DelayedLink {
    /// Creates TUN `tsw-a` in namespace `a` (its nsfs file, e.g. /run/netns/x) with
    /// 10.213.9.1 peer 10.213.9.2, and `tsw-b` in `b` with 10.213.9.2 peer 10.213.9.1,
    /// both up, and starts the carriers. Every packet from A waits `a_to_b` before B
    /// sees it, and every packet from B `b_to_a`.
    pub fn new(a: &Path, b: &Path, a_to_b: Duration, b_to_a: Duration) -> io::Result<DelayedLink> {
        let tun_a = Arc::new(tun_in(a, TUN_A, WIRE_A_ADDR, WIRE_B_ADDR)?);
        let tun_b = Arc::new(tun_in(b, TUN_B, WIRE_B_ADDR, WIRE_A_ADDR)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut link = DelayedLink {
            a_addr: WIRE_A_ADDR,
            b_addr: WIRE_B_ADDR,
            stop,
            threads: Vec::new(),
            logs: Default::default(),
        };
        // From here on, a failure drops the link, which stops what was started.
        for (from, to, delay, name, log) in [
            (&tun_a, &tun_b, a_to_b, "wire-a-to-b", &link.logs[0]),
            (&tun_b, &tun_a, b_to_a, "wire-b-to-a", &link.logs[1]),
        ] {
            let (from, to, stop) = (Arc::clone(from), Arc::clone(to), Arc::clone(&link.stop));
            let log = Arc::clone(log);
            link.threads.push(
                std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn(move || carry(&from, &to, delay, &stop, &log))?,
            );
        }
        Ok(link)
    }

    /// What the carrier from B to A did so far (A to B's is kept alike, for a test
    /// that delays that way).
    pub fn b_to_a(&self) -> CarrierLog {
        lock(&self.logs[1]).clone()
    }
}

/// The log, even when a carrier panicked holding it (what it logged stays true).
fn lock(log: &Mutex<CarrierLog>) -> std::sync::MutexGuard<'_, CarrierLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs `f` on a thread that has joined the network namespace at `ns` (an nsfs file:
/// /run/netns/NAME or /proc/PID/ns/net). Sockets and devices it creates stay in that
/// namespace whichever thread uses them later; the rest of the process is unaffected.
pub fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let file = File::open(ns).map_err(|e| context(e, format!("open {}", ns.display())))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: the fd is `file`'s, open for the call; setns changes only
                // this thread, which ends with the scope.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let e = io::Error::last_os_error();
                    return Err(context(e, format!("setns {}", ns.display())));
                }
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Opens TUN device `name` in the namespace at `ns`, addressed `addr` peer `peer`, up.
/// Closing the file removes the device.
fn tun_in(ns: &Path, name: &str, addr: Ipv4Addr, peer: Ipv4Addr) -> io::Result<File> {
    let step = |what: &str| format!("{what} {name} in {}", ns.display());
    in_netns(ns, || {
        let tun = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map_err(|e| context(e, step("open /dev/net/tun for")))?;
        let mut req = IfreqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as c_short,
            _pad: [0; 22],
        };
        // Leaves the final NUL: names are at most IFNAMSIZ - 1 bytes.
        let len = name.len().min(libc::IFNAMSIZ - 1);
        for (dst, src) in req.name.iter_mut().zip(&name.as_bytes()[..len]) {
            *dst = *src as c_char;
        }
        // SAFETY: the fd is `tun`'s, open; `req` is a valid ifreq for TUNSETIFF, which
        // reads and writes only its 40 bytes.
        if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) } != 0 {
            return Err(context(io::Error::last_os_error(), step("TUNSETIFF")));
        }
        // `ip` forks from this thread, so it runs in the namespace too.
        let (addr, peer) = (addr.to_string(), peer.to_string());
        ip(&["addr", "add", &addr, "peer", &peer, "dev", name])
            .map_err(|e| context(e, step("address")))?;
        ip(&["link", "set", name, "up"]).map_err(|e| context(e, step("link up")))?;
        Ok(tun)
    })
}

/// Puts this thread ahead of ordinary ones (SCHED_FIFO, low priority): on a machine busy
/// compiling, a carrier woken late would add milliseconds to the delay it stands for.
/// Without the privilege it stays as it was, only less punctual: then false.
fn punctual() -> bool {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid sched_param; the call changes only this thread.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) == 0 }
}

/// Carries packets from `from` to `to` until `stop`, each held `delay`, in order. One
/// thread both reads and writes, waking for whichever comes first (a packet to read,
/// one due to leave), so no hand-over between threads adds its own latency. Logs how
/// long each packet was really held.
fn carry(from: &File, to: &File, delay: Duration, stop: &AtomicBool, log: &Mutex<CarrierLog>) {
    // The default 50 us timer slack would add to every delay (SCHED_FIFO ignores it;
    // this is for when punctual() was refused).
    // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    lock(log).punctual = punctual();
    // When each packet was read, when it may leave, and the packet.
    let mut held: VecDeque<(Instant, Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; READ_BUF];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while held.front().is_some_and(|(_, leaves, _)| *leaves <= now) {
            if let Some((read, _, packet)) = held.pop_front() {
                // A packet the stack refuses is a packet lost on the wire.
                if (&*to).write(&packet).is_ok() {
                    lock(log).held.push(read.elapsed());
                }
            }
        }
        let wait = held.front().map_or(IDLE_WAIT, |(_, leaves, _)| {
            leaves.saturating_duration_since(now).min(IDLE_WAIT)
        });
        let mut pfd = libc::pollfd {
            fd: from.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `pfd` is one valid pollfd whose fd `from` holds open; `timeout` is
        // valid; a null sigmask leaves the thread's as it is.
        let ready = unsafe { libc::ppoll(&mut pfd, 1, &timeout, std::ptr::null()) };
        if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        if ready <= 0 {
            continue;
        }
        match (&*from).read(&mut buf) {
            Ok(n) => {
                let read = Instant::now();
                held.push_back((read, read + delay, buf[..n].to_vec()));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The device failed: nothing more will come through it.
            Err(_) => return,
        }
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "ip {}: {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// The same error kind, its message prefixed with the step that failed.
fn context(e: io::Error, step: String) -> io::Error {
    io::Error::new(e.kind(), format!("{step}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::NetnsPair;
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::mpsc;

    const PORT: u16 = 7070;
    const ROUND_TRIPS: usize = 20;
    const MSG: &[u8] = b"token";
    const HALF_MS: Duration = Duration::from_micros(500);
    const FIVE_MS: Duration = Duration::from_millis(5);

    /// One echo: when A sent, when B read it, when A read the echo.
    struct Trip {
        sent: Instant,
        arrived: Instant,
        done: Instant,
    }

    /// What the server saw: its peer's address, then when each message arrived.
    struct Seen {
        peer: mpsc::Receiver<SocketAddr>,
        arrivals: mpsc::Receiver<Instant>,
    }

    /// Listens on `addr` in namespace `ns` and echoes one connection. Punctual like the
    /// carriers, so the machine's load shows as little as it can in what is measured.
    fn echo_server(ns: &Path, addr: SocketAddr) -> Seen {
        let listener = in_netns(ns, || TcpListener::bind(addr)).expect("listen");
        let (peer_tx, peer) = mpsc::channel();
        let (seen_tx, arrivals) = mpsc::channel();
        std::thread::spawn(move || {
            punctual();
            let Ok((mut conn, from)) = listener.accept() else {
                return;
            };
            let _ = peer_tx.send(from);
            let _ = conn.set_nodelay(true);
            let mut buf = [0u8; MSG.len()];
            while conn.read_exact(&mut buf).is_ok() {
                let _ = seen_tx.send(Instant::now());
                if conn.write_all(&buf).is_err() {
                    return;
                }
            }
        });
        Seen { peer, arrivals }
    }

    /// Connects from namespace `ns` to `server` and times `n` echoes, on a punctual
    /// thread of its own. Both ends must see the same 4-tuple, with the client on
    /// `client_addr`: the wire translates nothing.
    fn round_trips(
        ns: &Path,
        client_addr: Ipv4Addr,
        server: SocketAddr,
        seen: Seen,
        n: usize,
    ) -> Vec<Trip> {
        let mut client = in_netns(ns, || {
            TcpStream::connect_timeout(&server, Duration::from_secs(2))
        })
        .unwrap_or_else(|e| panic!("{} reaches {server}: {e}", ns.display()));
        let local = client.local_addr().expect("local address");
        let peer = client.peer_addr().expect("peer address");
        let seen_from = seen
            .peer
            .recv_timeout(Duration::from_secs(2))
            .expect("the server accepted");
        println!("{local} -> {peer}, accepted from {seen_from}");
        assert_eq!(local.ip(), client_addr, "the client leaves by the wire");
        assert_eq!(
            (local, peer),
            (seen_from, server),
            "both ends see the same 4-tuple"
        );
        std::thread::spawn(move || {
            punctual();
            client.set_nodelay(true).expect("TCP_NODELAY");
            client
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("read timeout");
            let mut buf = [0u8; MSG.len()];
            (0..n)
                .map(|_| {
                    let sent = Instant::now();
                    client.write_all(MSG).expect("send");
                    client.read_exact(&mut buf).expect("the echo within 2 s");
                    let done = Instant::now();
                    assert_eq!(&buf, MSG, "the echo is what was sent");
                    let arrived = seen.arrivals.recv().expect("the server saw the message");
                    Trip {
                        sent,
                        arrived,
                        done,
                    }
                })
                .collect()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Durations sorted, printed as min/median/max.
    struct Spread(Vec<Duration>);

    impl Spread {
        fn of(label: &str, samples: impl Iterator<Item = Duration>) -> Spread {
            let mut samples: Vec<Duration> = samples.collect();
            samples.sort();
            let spread = Spread(samples);
            println!(
                "{label}: min {:?} median {:?} max {:?}",
                spread.min(),
                spread.median(),
                spread.0[spread.0.len() - 1]
            );
            spread
        }
        fn min(&self) -> Duration {
            self.0[0]
        }
        fn median(&self) -> Duration {
            self.0[self.0.len() / 2]
        }
    }

    /// Load only ever adds latency: the fastest round trip is the wire's own delay plus
    /// its overhead, the median what a test using the wire sees. A round trip crosses the
    /// wire twice: +1.5 ms at the median (fresh-clone CIs saw 5.6 and 6.2 ms medians
    /// among the parallel unit tests, 5.3-5.9 ms alone on an idle VM). Never less than
    /// the delay. Single samples are not judged: on
    /// 2 CPUs busy compiling, a non-preemptible kernel (PREEMPT_NONE) wakes even a
    /// SCHED_FIFO thread a few milliseconds late now and then.
    fn assert_five_ms(who: &str, rtt: &Spread) {
        let most = FIVE_MS + 3 * HALF_MS;
        assert!(
            rtt.min() >= FIVE_MS && rtt.min() <= most && rtt.median() <= most,
            "{who}'s fastest and median round trips are 5 ms, +1.5 at most (two crossings): {:?}",
            rtt.0
        );
    }

    /// Timed to the half millisecond: run by `cargo xtask test` after the parallel unit
    /// tests and the Python environments they overlap (`--ignored`, one at a time), where
    /// nothing else loads the two CPUs.
    #[test]
    #[ignore = "timing-sensitive: cargo xtask test runs it alone, after the parallel unit tests"]
    fn wire_holds_each_direction_for_its_own_delay_on_real_tcp() {
        let pair = NetnsPair::new("wire").expect("two namespaces (root, ip)");
        let (a, b) = (pair.a.path(), pair.b.path());
        let link = DelayedLink::new(&a, &b, Duration::ZERO, FIVE_MS)
            .expect("a TUN device in each namespace, joined by this process");

        let server = SocketAddr::from((link.b_addr, PORT));
        let seen = echo_server(&b, server);
        let trips = round_trips(&a, link.a_addr, server, seen, ROUND_TRIPS);
        let there = Spread::of("A -> B (0 ms)", trips.iter().map(|t| t.arrived - t.sent));
        let back = Spread::of("B -> A (5 ms)", trips.iter().map(|t| t.done - t.arrived));
        let rtt = Spread::of("A's round trip", trips.iter().map(|t| t.done - t.sent));
        // +1 ms as the held leg: a fresh-clone CI saw a 0.53 ms median for this leg
        // (its fastest 0.15 ms), and a wire that holds it 5 ms still fails.
        assert!(
            there.median() <= 2 * HALF_MS,
            "A -> B is not held (median within 1 ms): {:?}",
            there.0
        );
        // Medians seen on an idle 2-CPU VM: 5.22-5.59 ms for the held leg, round trips
        // 5.33-6.2; +1 and +1.5 ms leave room for its scheduling and still fail a wire
        // that holds both legs or one leg twice.
        assert!(
            back.min() >= FIVE_MS && back.median() <= FIVE_MS + 2 * HALF_MS,
            "B -> A is held 5 ms, never less (median within +1): {:?}",
            back.0
        );
        assert_five_ms("A", &rtt);

        // The other way: B connects to a server in A.
        let server = SocketAddr::from((link.a_addr, PORT));
        let seen = echo_server(&a, server);
        let trips = round_trips(&b, link.b_addr, server, seen, ROUND_TRIPS);
        let rtt = Spread::of("B's round trip", trips.iter().map(|t| t.done - t.sent));
        assert_five_ms("B", &rtt);

        drop(link);
        let gone = Command::new("ip")
            .args(["-n", &pair.a.name, "link", "show", TUN_A])
            .output()
            .expect("ip link show");
        assert!(!gone.status.success(), "{TUN_A} vanishes with the link");
    }

    #[test]
    fn wire_names_the_step_that_failed() {
        let missing = Path::new("/run/netns/tokenscope-no-such-namespace");
        let e = DelayedLink::new(missing, missing, Duration::ZERO, Duration::ZERO)
            .expect_err("no link without its namespaces");
        let step = format!("open {}: ", missing.display());
        assert!(
            e.kind() == io::ErrorKind::NotFound && e.to_string().starts_with(&step),
            "the error names the step and the path ({step}...), keeping its kind: {e} ({:?})",
            e.kind()
        );
    }
}
