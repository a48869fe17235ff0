use super::*;

#[test]
fn proc_files_are_parsed_as_procfs_does() {
    let stat = parse_stat("4242 (csi prov (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 9 0 123456 104857600 2048 18446744073709551615").unwrap();
    assert_eq!((stat.utime + stat.stime) / USER_HZ, 4.0);
    assert_eq!(stat.start_ticks, 123_456.0);
    assert_eq!(stat.vsize, 104_857_600.0);
    assert_eq!(
        boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
        Some(1_700_000_000.0)
    );
    assert_eq!(
        status_kib("Name:\tx\nVmRSS:\t   12345 kB\n", "VmRSS:"),
        Some(12_345.0)
    );
    let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \nMax address space         unlimited            unlimited            bytes     \n";
    assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
    assert_eq!(
        soft_limit(limits, "Max address space"),
        Some(18_446_744_073_709_551_615.0)
    );
    let netstat =
        "TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 5000 7000\n";
    assert_eq!(ip_ext(netstat, "InOctets"), Some(5000.0));
    assert_eq!(ip_ext(netstat, "OutOctets"), Some(7000.0));
}

#[cfg(target_os = "linux")]
#[test]
fn this_process_is_described() {
    let f = Figures::read();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = f.start_time_seconds.unwrap();
    assert!(start <= now + 1.0 && start > now - 24.0 * 3600.0, "{start}");
    assert!(f.resident_bytes.unwrap() > 1e6);
    assert!(f.virtual_bytes.unwrap() >= f.resident_bytes.unwrap());
    assert!(f.open_fds.unwrap() >= 3.0);
    assert!(f.max_fds.unwrap() >= f.open_fds.unwrap());
    assert!(f.cpu_seconds.unwrap() >= 0.0);
}
