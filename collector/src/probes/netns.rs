//! `--netns`: the one network namespace a recording is limited to, as the user named
//! it (a namespace file or a process), and its inode, which is what the probes compare.

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A network namespace: a namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`) or
/// the process whose namespace it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetnsTarget {
    File(PathBuf),
    Process(u32),
}

impl std::str::FromStr for NetnsTarget {
    type Err = String;

    /// Digits name a process (`./123` names a file called 123); anything else a file.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err("a namespace file or a process id".into());
        }
        Ok(match s.parse() {
            Ok(pid) => NetnsTarget::Process(pid),
            Err(_) => NetnsTarget::File(PathBuf::from(s)),
        })
    }
}

impl fmt::Display for NetnsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetnsTarget::File(path) => write!(f, "{}", path.display()),
            NetnsTarget::Process(pid) => write!(f, "{pid}"),
        }
    }
}

impl NetnsTarget {
    /// The namespace's inode (what `ip netns identify` and `/proc/PID/ns/net`'s
    /// `net:[N]` show), or why this names no network namespace.
    pub fn inode(&self) -> Result<u32, String> {
        let path = match self {
            NetnsTarget::File(path) => path.clone(),
            NetnsTarget::Process(pid) => {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return Err("no such process".into());
                }
                PathBuf::from(format!("/proc/{pid}/ns/net"))
            }
        };
        inode_of(&path).map_err(|why| match self {
            NetnsTarget::File(_) => why,
            NetnsTarget::Process(_) => format!("{}: {why}", path.display()),
        })
    }
}

/// What `path` must be: a file of nsfs (the namespace filesystem) whose namespace
/// is a network one.
fn inode_of(path: &Path) -> Result<u32, String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        _ => e.to_string(),
    })?;
    let c_path =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in the path".to_string())?;
    // SAFETY: statfs is plain data; a valid NUL-terminated path and out-pointer.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if fs.f_type != libc::NSFS_MAGIC {
        let what = if meta.is_dir() {
            "a directory"
        } else if meta.is_file() {
            "a regular file"
        } else {
            "not a namespace file"
        };
        return Err(format!(
            "not a network namespace ({what}; give /run/netns/NAME, /proc/PID/ns/net or a PID)"
        ));
    }
    // SAFETY: a valid NUL-terminated path; an nsfs file does not block on open.
    let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the CLONE_NEW* kind.
    let kind = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWNET {
        return Err("not a network namespace (a namespace of another kind)".into());
    }
    u32::try_from(meta.ino()).map_err(|_| format!("inode {} out of range", meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::NetnsTarget;

    fn own_inode() -> u32 {
        let link = std::fs::read_link("/proc/self/ns/net").expect("readlink /proc/self/ns/net");
        let text = link.to_str().expect("utf-8");
        text.strip_prefix("net:[")
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("net:[N], got {text}"))
    }

    #[test]
    fn a_pid_or_its_namespace_file_name_the_same_namespace() {
        let me: NetnsTarget = std::process::id().to_string().parse().unwrap();
        assert_eq!(me, NetnsTarget::Process(std::process::id()));
        assert_eq!(
            me.inode(),
            Ok(own_inode()),
            "a pid names its /proc/PID/ns/net"
        );
        let file: NetnsTarget = "/proc/self/ns/net".parse().unwrap();
        assert_eq!(file.inode(), Ok(own_inode()), "the namespace file itself");
    }

    #[test]
    fn what_is_not_a_network_namespace_says_why() {
        let why = |s: &str| s.parse::<NetnsTarget>().unwrap().inode().unwrap_err();
        assert_eq!(why("/nonexistent/netns"), "no such file");
        assert!(why("/proc/self/status").contains("not a network namespace (a regular file"));
        assert!(why("/proc").contains("a directory"));
        assert!(
            why("/proc/self/ns/mnt").contains("another kind"),
            "a mount namespace file is nsfs, but not a network namespace"
        );
        // Above the kernel's pid_max (4194304): never a process.
        assert_eq!(why("99999999"), "no such process");
        assert!("".parse::<NetnsTarget>().is_err());
    }
}
