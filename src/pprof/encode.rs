//! Turns pprof-rs' raw samples into a gzip-compressed `profile.proto`, as Go's
//! `/debug/pprof/profile` serves it.
//!
//! Every location carries its address and the mapped file it falls in, as Go's profiles do, so a
//! profile of a binary without symbols (release builds are stripped) can still be symbolized by
//! `go tool pprof <unstripped binary> <profile>`.

use std::collections::HashMap;
use std::io::Write;
use std::time::UNIX_EPOCH;

use flate2::Compression;
use flate2::write::GzEncoder;
use pprof::UnresolvedReport;
use prost::Message;

use super::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// Interns strings into the profile's string table (index 0 is the empty string).
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Self::default();
        strings.intern("");
        strings
    }

    fn intern(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

/// One executable mapping of `/proc/self/maps`.
struct MappedFile {
    start: u64,
    limit: u64,
    offset: u64,
    path: String,
}

/// The file-backed executable mappings of this process, the program's own first: pprof takes
/// the first mapping for the binary named on its command line. Empty where `/proc/self/maps`
/// cannot be read (the profile then has no mappings, which viewers accept).
fn executable_mappings() -> Vec<MappedFile> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|path| path.display().to_string())
        .unwrap_or_default();
    let mut files: Vec<MappedFile> = maps.lines().filter_map(parse_maps_line).collect();
    files.sort_by_key(|file| (file.path != exe, file.start));
    files
}

/// `start-limit perms offset dev inode path`, kept when executable and backed by a file.
fn parse_maps_line(line: &str) -> Option<MappedFile> {
    let mut fields = line.split_whitespace();
    let (start, limit) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let path = fields.nth(2)?;
    if !perms.contains('x') || !path.starts_with('/') {
        return None;
    }
    Some(MappedFile {
        start: u64::from_str_radix(start, 16).ok()?,
        limit: u64::from_str_radix(limit, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_owned(),
    })
}

/// What symbolization found for one address: (name, mangled name, file, line), innermost first.
type Symbols = Vec<(String, String, String, i64)>;

fn symbolize(frame: &backtrace::Frame) -> Symbols {
    let mut symbols = Vec::new();
    backtrace::resolve_frame(frame, |symbol| {
        let Some(name) = symbol.name() else { return };
        symbols.push((
            // `{:#}`: demangled without the hash suffix, as people read Rust names.
            format!("{name:#}"),
            String::from_utf8_lossy(name.as_bytes()).into_owned(),
            symbol
                .filename()
                .map(|path| path.display().to_string())
                .unwrap_or_default(),
            symbol.lineno().map_or(0, i64::from),
        ));
    });
    symbols
}

/// Builds the profile, symbolizing each sampled address once.
pub(crate) fn profile(report: &UnresolvedReport) -> Profile {
    let mut strings = Strings::new();
    let files = executable_mappings();
    // Per mapping: (used, every location in it had a name, file and line).
    let mut file_use: Vec<(bool, bool, bool)> = vec![(false, true, true); files.len()];
    let mut functions: HashMap<(String, String), Function> = HashMap::new();
    let mut locations: HashMap<u64, Location> = HashMap::new();
    let mut symbol_cache: HashMap<u64, Symbols> = HashMap::new();
    let frequency = i64::from(report.timing.frequency.max(1));
    let period = 1_000_000_000 / frequency;
    let thread_key = strings.intern("thread");

    let mut samples = Vec::with_capacity(report.data.len());
    for (stack, &count) in &report.data {
        let mut addresses: Vec<u64> = Vec::with_capacity(stack.frames.len());
        let mut named: Vec<bool> = Vec::with_capacity(stack.frames.len());
        for frame in &stack.frames {
            let ip = frame.ip() as u64;
            let symbols = symbol_cache.entry(ip).or_insert_with(|| symbolize(frame));
            named.push(
                symbols
                    .iter()
                    .any(|(name, ..)| name.contains("perf_signal_handler")),
            );
            addresses.push(ip);
        }
        // The first frames are the profiler's signal handler and the kernel's return trampoline
        // after it; the interrupted code starts after them. Unnamed (stripped binary): keep all.
        let skip = named
            .iter()
            .position(|&is_handler| is_handler)
            .map_or(0, |at| at + 2);
        let mut location_ids = Vec::with_capacity(addresses.len().saturating_sub(skip));
        for (depth, &ip) in addresses.iter().enumerate().skip(skip) {
            // A caller's address is its return address; one less lands inside the call, as Go
            // writes it (the leaf is the interrupted instruction itself).
            let address = if depth == skip {
                ip
            } else {
                ip.saturating_sub(1)
            };
            let next_id = locations.len() as u64 + 1;
            let location = locations.entry(address).or_insert_with(|| {
                let mapping = files
                    .iter()
                    .position(|file| file.start <= address && address < file.limit);
                let symbols = &symbol_cache[&ip];
                let mut lines = Vec::with_capacity(symbols.len());
                for (name, system_name, file, line) in symbols {
                    let next_function = functions.len() as u64 + 1;
                    let function = functions
                        .entry((name.clone(), file.clone()))
                        .or_insert_with(|| Function {
                            id: next_function,
                            name: strings.intern(name),
                            system_name: strings.intern(system_name),
                            filename: strings.intern(file),
                            start_line: 0,
                        });
                    lines.push(Line {
                        function_id: function.id,
                        line: *line,
                        column: 0,
                    });
                }
                if let Some(index) = mapping {
                    let used = &mut file_use[index];
                    used.0 = true;
                    used.1 &= !symbols.is_empty();
                    used.2 &= symbols
                        .iter()
                        .all(|(_, _, file, line)| !file.is_empty() && *line > 0);
                }
                Location {
                    id: next_id,
                    mapping_id: mapping.map_or(0, |index| index as u64 + 1),
                    address,
                    line: lines,
                    is_folded: false,
                }
            });
            location_ids.push(location.id);
        }
        let count = count as i64;
        let name = &stack.thread_name[..stack.thread_name_length.min(stack.thread_name.len())];
        let thread = if name.is_empty() {
            strings.intern(&stack.thread_id.to_string())
        } else {
            strings.intern(&String::from_utf8_lossy(name))
        };
        samples.push(Sample {
            location_id: location_ids,
            value: vec![count, count * period],
            label: vec![Label {
                key: thread_key,
                str: thread,
                num: 0,
                num_unit: 0,
            }],
        });
    }

    let mapping = files
        .iter()
        .zip(&file_use)
        .enumerate()
        .map(|(index, (file, &(_, functions, lines)))| Mapping {
            id: index as u64 + 1,
            memory_start: file.start,
            memory_limit: file.limit,
            file_offset: file.offset,
            filename: strings.intern(&file.path),
            build_id: 0,
            // False lets a viewer symbolize this file's addresses from a local binary.
            has_functions: functions,
            has_filenames: lines,
            has_line_numbers: lines,
            has_inline_frames: functions,
        })
        .collect();
    let mut location: Vec<Location> = locations.into_values().collect();
    location.sort_by_key(|location| location.id);
    let mut function: Vec<Function> = functions.into_values().collect();
    function.sort_by_key(|function| function.id);
    let cpu = ValueType {
        r#type: strings.intern("cpu"),
        unit: strings.intern("nanoseconds"),
    };
    let samples_count = ValueType {
        r#type: strings.intern("samples"),
        unit: strings.intern("count"),
    };
    let start = report.timing.start_time;
    let since_epoch = start.duration_since(UNIX_EPOCH).unwrap_or_default();
    Profile {
        sample_type: vec![samples_count, cpu],
        sample: samples,
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX),
        duration_nanos: i64::try_from(report.timing.duration.as_nanos()).unwrap_or(i64::MAX),
        period_type: Some(cpu),
        period,
        ..Profile::default()
    }
}

/// The profile as served: protobuf, gzip-compressed.
pub(crate) fn gzipped(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(&profile.encode_to_vec())?;
    encoder.finish()
}
