use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use flate2::read::GzDecoder;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::proto::Profile;
use super::{cpu, seconds};
use crate::config::HttpOptions;
use crate::http::{Health, bind};
use crate::metrics::Metrics;

/// The process has one profiler: the tests that start it take turns.
static PROFILER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serves the HTTP server on a free port until the test ends.
async fn serve(enable_pprof: bool) -> SocketAddr {
    let options = HttpOptions {
        address: "127.0.0.1:0".into(),
        address_flag: "--http-endpoint",
        metrics_path: "/metrics".into(),
        enable_pprof,
        leader_election_health: false,
    };
    let server = bind(&options, Arc::new(Metrics::new()), Health::default())
        .await
        .unwrap();
    let address = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    address
}

/// A minimal HTTP/1.1 GET: (status, raw head, body).
async fn get(address: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .unwrap();
    let head = String::from_utf8(response[..split].to_vec()).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, response[split + 4..].to_vec())
}

/// Burns CPU in a recognisable function until `stop` is set.
#[inline(never)]
fn spin_for_the_profiler(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profile_is_a_gzipped_pprof_profile_showing_where_time_went() {
    let _turn = PROFILER.lock().await;
    let address = serve(true).await;
    let stop = Arc::new(AtomicBool::new(false));
    let burner = {
        let stop = stop.clone();
        std::thread::spawn(move || spin_for_the_profiler(&stop))
    };
    let (status, head, body) = get(address, "/debug/pprof/profile?seconds=1").await;
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    assert_eq!(status, 200, "{head}\n{}", String::from_utf8_lossy(&body));
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-type: application/octet-stream")
            && head.contains("content-disposition: attachment; filename=\"profile\""),
        "{head}"
    );

    let mut decoded = Vec::new();
    GzDecoder::new(body.as_slice())
        .read_to_end(&mut decoded)
        .expect("the profile is gzip-compressed");
    let profile = Profile::decode(decoded.as_slice()).expect("the profile is profile.proto");
    let string = |index: i64| profile.string_table[usize::try_from(index).unwrap()].as_str();
    assert_eq!(
        string(0),
        "",
        "the string table starts with the empty string"
    );
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (string(t.r#type), string(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period_type = profile.period_type.unwrap();
    assert_eq!(
        (string(period_type.r#type), string(period_type.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(profile.period, 10_000_000, "100 Hz, as Go samples");
    assert!(
        profile.duration_nanos >= 900_000_000,
        "{}",
        profile.duration_nanos
    );
    assert!(
        !profile.sample.is_empty(),
        "a second of busy CPU gives samples"
    );

    // Every reference resolves, as viewers require.
    let location = |id: u64| profile.location.iter().find(|l| l.id == id).unwrap();
    let function = |id: u64| profile.function.iter().find(|f| f.id == id).unwrap();
    let mut names = Vec::new();
    let mut spin_locations = Vec::new();
    for sample in &profile.sample {
        assert_eq!(sample.value.len(), 2);
        assert_eq!(sample.value[1], sample.value[0] * profile.period);
        for &id in &sample.location_id {
            let location = location(id);
            assert!(
                location.mapping_id == 0
                    || profile.mapping.iter().any(|m| m.id == location.mapping_id)
            );
            for line in &location.line {
                let name = string(function(line.function_id).name);
                if name.ends_with("spin_for_the_profiler") {
                    spin_locations.push(location);
                }
                names.push(name.to_owned());
            }
        }
    }
    assert!(
        names
            .iter()
            .any(|name| name.ends_with("spin_for_the_profiler")),
        "the busy function appears in the profile: {names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|name| name.contains("perf_signal_handler")),
        "the profiler's own frames are cut off"
    );
}

#[tokio::test]
async fn a_second_profile_while_one_runs_gets_go_error() {
    let _turn = PROFILER.lock().await;
    let address = serve(true).await;
    let running = cpu::start().unwrap();
    let (status, head, body) = get(address, "/debug/pprof/profile?seconds=1").await;
    assert_eq!(status, 500);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        "Could not enable CPU profiling: cpu profiling already in use\n"
    );
    assert!(
        head.to_ascii_lowercase().contains("x-go-pprof: 1"),
        "{head}"
    );
    drop(running);
    // Released with the first: the next profile can start.
    drop(cpu::start().unwrap());
}

#[tokio::test]
async fn index_cmdline_and_unknown_profiles_answer_as_go() {
    let address = serve(true).await;
    let (status, _, body) = get(address, "/debug/pprof/").await;
    let index = String::from_utf8(body).unwrap();
    assert_eq!(status, 200);
    assert!(
        index.contains("href=\"profile\"") && index.contains("href=\"cmdline\""),
        "{index}"
    );

    let (status, _, body) = get(address, "/debug/pprof/cmdline").await;
    assert_eq!(status, 200);
    let argv: Vec<Vec<u8>> = std::env::args_os()
        .map(|arg| std::os::unix::ffi::OsStrExt::as_bytes(arg.as_os_str()).to_vec())
        .collect();
    assert_eq!(body, argv.join(&0u8));

    for name in ["heap", "goroutine", "trace", "symbol", "no/such"] {
        let (status, _, body) = get(address, &format!("/debug/pprof/{name}")).await;
        assert_eq!(
            (status, body.as_slice()),
            (404, b"Unknown profile\n".as_slice()),
            "{name}"
        );
    }
    let (status, head, _) = get(address, "/debug/pprof").await;
    assert_eq!(status, 301);
    assert!(
        head.to_ascii_lowercase()
            .contains("location: /debug/pprof/"),
        "{head}"
    );
}

#[tokio::test]
async fn without_enable_pprof_nothing_is_served() {
    let address = serve(false).await;
    for path in [
        "/debug/pprof/",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/cmdline",
    ] {
        assert_eq!(get(address, path).await.0, 404, "{path}");
    }
    assert_eq!(get(address, "/metrics").await.0, 200);
}

#[test]
fn seconds_default_to_30_unless_a_positive_integer() {
    assert_eq!(seconds(None), 30);
    assert_eq!(seconds(Some("5")), 5);
    assert_eq!(seconds(Some("+5")), 5);
    for bad in ["0", "-3", "1.5", "x", ""] {
        assert_eq!(seconds(Some(bad)), 30, "{bad}");
    }
}
