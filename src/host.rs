//! The machine's host name, as upstream's Go code reads it.

/// Go's `os.Hostname()`: the kernel's host name (`/proc/sys/kernel/hostname`), which in a pod is
/// the pod's name. Upstream's event source (`<driver>_<host>_<uuid>`) is built from it, so ours
/// is too; `HOSTNAME`, then `localhost`, only where the kernel's cannot be read.
pub(crate) fn os_hostname() -> String {
    kernel()
        .or_else(env)
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `/proc/sys/kernel/hostname`, trimmed; `None` when unreadable or blank.
pub(crate) fn kernel() -> Option<String> {
    trimmed(std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
}

/// `HOSTNAME`, trimmed; `None` when unset or blank.
pub(crate) fn env() -> Option<String> {
    trimmed(std::env::var("HOSTNAME").ok())
}

fn trimmed(name: Option<String>) -> Option<String> {
    name.map(|h| h.trim().to_owned()).filter(|h| !h.is_empty())
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
