//! The Prometheus process collector's series (`process_*`), read from /proc at scrape time with
//! the names, types and units of the Go client's collector, so dashboards built for Istio's agent
//! keep working. A scrape reads four small files and lists /proc/self/fd (bounded by the fd
//! limit); a file that cannot be read leaves its series out rather than failing the scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The fields of `/proc/<pid>/stat` the collector uses, in clock ticks and pages as the kernel
/// gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub starttime_ticks: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // rest starts at field 3 (state); field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().take(22).collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        starttime_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The boot time (`btime`, seconds since the epoch) from `/proc/stat`.
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// One scrape's values, in the collector's units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

impl Sample {
    /// Converts kernel units: ticks per second and the page size come from sysconf.
    pub fn from_stat(stat: Stat, btime: Option<u64>, ticks_per_sec: f64, page_size: f64) -> Self {
        Sample {
            cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / ticks_per_sec,
            resident_bytes: stat.rss_pages as f64 * page_size,
            virtual_bytes: stat.vsize_bytes as f64,
            start_time_seconds: btime
                .map(|b| b as f64 + stat.starttime_ticks as f64 / ticks_per_sec),
            open_fds: None,
            max_fds: None,
        }
    }

    /// Reads this process's values now.
    pub fn read_self() -> Option<Sample> {
        let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_btime(&t));
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
        let page = if page > 0 { page as f64 } else { 4096.0 };
        let mut sample = Sample::from_stat(stat, btime, ticks, page);
        sample.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64);
        // The soft limit, as the Go collector reads "Max open files" from /proc/self/limits.
        sample.max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft as f64);
        Some(sample)
    }
}

/// Registered in every scrape's registry; reads /proc when encoded.
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let Some(s) = Sample::read_self() else {
            return Ok(());
        };
        // Registered without `_total`: the encoder appends it (as for every counter here).
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        if let Some(v) = s.open_fds {
            gauge(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors",
                v,
            )?;
        }
        if let Some(v) = s.max_fds {
            let help = "Maximum number of open file descriptors";
            gauge(&mut enc, "process_max_fds", help, v)?;
        }
        let help = "Virtual memory size in bytes";
        gauge(
            &mut enc,
            "process_virtual_memory_bytes",
            help,
            s.virtual_bytes,
        )?;
        let help = "Resident memory size in bytes";
        gauge(
            &mut enc,
            "process_resident_memory_bytes",
            help,
            s.resident_bytes,
        )?;
        if let Some(v) = s.start_time_seconds {
            let help = "Start time of the process since unix epoch in seconds";
            gauge(&mut enc, "process_start_time_seconds", help, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with spaces and a ')' must not shift the fields.
        let text = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 130 0 0 20 0 9 0 \
                    123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        let stat = parse_stat(text).expect("parsed");
        assert_eq!(
            stat,
            Stat {
                utime_ticks: 250,
                stime_ticks: 130,
                starttime_ticks: 123456,
                vsize_bytes: 987654321,
                rss_pages: 2048,
            }
        );
        let s = Sample::from_stat(stat, Some(1_700_000_000), 100.0, 4096.0);
        assert_eq!(s.cpu_seconds, 3.8);
        assert_eq!(s.resident_bytes, 2048.0 * 4096.0);
        assert_eq!(s.virtual_bytes, 987654321.0);
        assert_eq!(s.start_time_seconds, Some(1_700_000_000.0 + 1234.56));
        assert_eq!(parse_stat("12 (x) S 1 2"), None);
    }

    #[test]
    fn btime_is_read_from_proc_stat() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1712345678\nprocesses 9\n";
        assert_eq!(parse_btime(text), Some(1_712_345_678));
        assert_eq!(parse_btime("cpu 1\n"), None);
    }

    #[test]
    fn this_process_reads_plausibly() {
        let s = Sample::read_self().expect("read /proc/self");
        assert!(s.resident_bytes > 0.0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds.unwrap_or(0.0) >= 3.0, "{s:?}");
        assert!(s.max_fds.unwrap_or(0.0) >= s.open_fds.unwrap_or(0.0));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let start = s.start_time_seconds.expect("btime");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{s:?}"
        );
    }
}
