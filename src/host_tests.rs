use super::*;

#[test]
fn the_kernel_host_name_wins() {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let kernel = kernel.trim();
    if !kernel.is_empty() {
        assert_eq!(os_hostname(), kernel);
    }
}
