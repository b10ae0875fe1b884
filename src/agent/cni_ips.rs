//! The addresses a pod's CNI result named at ADD that no pod status can hold (a second address of
//! a family: a multi-IP or ENI primary plugin, Multus), and how a restarted agent learns them
//! again.
//!
//! The evidence is the ADD itself: the plugin's event IPs, checked by [`super::trust::verify`]
//! to be held by the sandbox's netns before any of the pod's containers ran. The pod's own
//! interfaces after that are not evidence: a workload with `NET_ADMIN` may add any address (a
//! future pod's, a Service's, one of another node's pods); in the host probe set such an address
//! would have the node's probe SNAT send host traffic to it as kubelet's, past ztunnel, and it
//! would make a later pod holding it look like a thief. The status is not evidence either (a real
//! API server keeps one address per family).
//!
//! So the agent writes the verified ADD addresses of each pod that has a second address of a
//! family to a record in its run dir (only such pods: most pods never cost a write), and a
//! restarted agent believes a recorded address only when it is still held by the netns the
//! /proc scan found for the pod by its status IP, is a pod address (no loopback, link-local,
//! ...), and is no other known pod's. The record is read bounded (size, pods, addresses per pod)
//! and a record that does not parse is ignored with a warning; a forged entry thus gains no more
//! than the pod's own netns already holds.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

/// The record's file name in the agent's run dir.
pub const RECORD_FILE: &str = "ambient-cni-ips.json";
/// The most bytes of the record read.
const MAX_RECORD_BYTES: u64 = 1 << 20;
/// The most pods taken from the record.
const MAX_PODS: usize = 4096;
/// The most addresses taken for one pod.
const MAX_IPS_PER_POD: usize = 16;
/// The longest UID taken (a Kubernetes UID is 36 characters).
const MAX_UID_LEN: usize = 128;

/// UID -> the addresses verified at the pod's ADD.
pub type Record = BTreeMap<String, Vec<IpAddr>>;

/// Why the record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("CNI address record {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("CNI address record {path} is not a regular file")]
    NotAFile { path: String },
    #[error("CNI address record {path} is larger than {MAX_RECORD_BYTES} bytes")]
    TooLarge { path: String },
    #[error("CNI address record {path} does not parse: {why}")]
    Malformed {
        path: String,
        #[source]
        why: Unparsable,
    },
}

/// What is wrong with a record's text.
#[derive(Debug, thiserror::Error)]
pub enum Unparsable {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("version {0} is not 1")]
    Version(serde_json::Value),
    #[error("no \"pods\" object")]
    NoPods,
}

/// Whether the verified ADD addresses hold one no status can: a second address of a family.
pub fn beyond_status(ips: &[IpAddr]) -> bool {
    let v4 = ips.iter().filter(|ip| ip.to_canonical().is_ipv4()).count();
    v4 > 1 || ips.len() - v4 > 1
}

/// The pod's addresses: its status IPs, then the recorded ones not among them.
pub fn union(status: &[IpAddr], recorded: &[IpAddr]) -> Vec<IpAddr> {
    let mut all = status.to_vec();
    for ip in recorded {
        if !all.iter().any(|a| crate::netns::procfs::same_ip(*a, *ip)) {
            all.push(*ip);
        }
    }
    all
}

/// Why a recorded address is not believed after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub ip: IpAddr,
    pub why: String,
}

/// The recorded addresses a restarted agent believes for a pod: those its netns still `held`, that
/// are pod addresses, and that no other known pod has (`owner_of` names the other pod).
pub fn validate(
    recorded: &[IpAddr],
    held: &[IpAddr],
    owner_of: impl Fn(IpAddr) -> Option<String>,
) -> (Vec<IpAddr>, Vec<Dropped>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for ip in recorded
        .iter()
        .take(MAX_IPS_PER_POD)
        .map(|ip| ip.to_canonical())
    {
        let why = if let Some(why) = super::trust::not_pod_address(ip) {
            Some(format!("not a pod address ({why})"))
        } else if !held.iter().any(|h| crate::netns::procfs::same_ip(*h, ip)) {
            Some("no longer held by the pod's netns".to_string())
        } else {
            owner_of(ip).map(|other| format!("the IP of another pod ({other})"))
        };
        match why {
            Some(why) => dropped.push(Dropped { ip, why }),
            None if !kept.contains(&ip) => kept.push(ip),
            None => {}
        }
    }
    (kept, dropped)
}

/// The record as written.
pub fn encode(record: &Record) -> String {
    let pods: BTreeMap<&String, Vec<String>> = record
        .iter()
        .map(|(uid, ips)| (uid, ips.iter().map(ToString::to_string).collect()))
        .collect();
    serde_json::json!({ "version": 1, "pods": pods }).to_string()
}

/// Parses a record; entries past the bounds, with a UID too long or an address that does not
/// parse, are left out.
pub fn decode(text: &str) -> Result<Record, Unparsable> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    if value["version"] != 1 {
        return Err(Unparsable::Version(value["version"].clone()));
    }
    let pods = value["pods"].as_object().ok_or(Unparsable::NoPods)?;
    let mut record = Record::new();
    for (uid, ips) in pods.iter().take(MAX_PODS) {
        if uid.is_empty() || uid.len() > MAX_UID_LEN {
            continue;
        }
        let ips: Vec<IpAddr> = ips
            .as_array()
            .into_iter()
            .flatten()
            .take(MAX_IPS_PER_POD)
            .filter_map(|ip| ip.as_str()?.parse().ok())
            .collect();
        if !ips.is_empty() {
            record.insert(uid.clone(), ips);
        }
    }
    Ok(record)
}

/// Reads the record in `dir`; none there is an empty record.
pub fn read(dir: &Path) -> Result<Record, RecordError> {
    use std::io::Read;
    let path = dir.join(RECORD_FILE);
    let shown = || path.display().to_string();
    use std::os::unix::fs::OpenOptionsExt;
    // Not blocking on a FIFO put in its place; only a regular file is read.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&path);
    let file = match opened {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => f,
        Ok(_) => return Err(RecordError::NotAFile { path: shown() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::new()),
        Err(source) => {
            return Err(RecordError::Io {
                path: shown(),
                source,
            });
        }
    };
    let mut text = String::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| RecordError::Io {
            path: shown(),
            source,
        })?;
    if text.len() as u64 > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge { path: shown() });
    }
    decode(&text).map_err(|why| RecordError::Malformed { path: shown(), why })
}

/// Replaces the record in `dir` whole (a temporary file renamed over it: a crash leaves the old
/// record or the new one); an empty record removes the file.
pub fn write(dir: &Path, record: &Record) -> Result<(), RecordError> {
    let path = dir.join(RECORD_FILE);
    let io = |source| RecordError::Io {
        path: path.display().to_string(),
        source,
    };
    if record.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        };
    }
    let tmp = dir.join(format!(".{RECORD_FILE}.tmp"));
    std::fs::write(&tmp, encode(record)).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_a_second_address_of_a_family_needs_a_record() {
        assert!(!beyond_status(&[ip("10.0.0.1")]));
        assert!(!beyond_status(&[ip("10.0.0.1"), ip("fd00::1")]));
        assert!(beyond_status(&[ip("10.0.0.1"), ip("10.0.0.2")]));
        assert!(beyond_status(&[
            ip("fd00::1"),
            ip("10.0.0.1"),
            ip("fd00::2")
        ]));
    }

    #[test]
    fn union_keeps_the_status_first_without_repeats() {
        let got = union(&[ip("10.0.0.1")], &[ip("10.0.0.1"), ip("10.0.0.2")]);
        assert_eq!(got, vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    }

    #[test]
    fn a_recorded_address_is_believed_only_when_held_a_pod_address_and_no_other_pods() {
        let recorded = [
            ip("10.0.0.2"),
            ip("10.0.0.3"),
            ip("10.0.0.4"),
            ip("169.254.7.127"),
            ip("127.0.0.1"),
        ];
        let held = [
            ip("127.0.0.1"),
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            ip("10.0.0.4"),
            ip("169.254.7.127"),
        ];
        let owner = |a: IpAddr| (a == ip("10.0.0.4")).then(|| "amb/other".to_string());
        let (kept, dropped) = validate(&recorded, &held, owner);
        assert_eq!(kept, vec![ip("10.0.0.2")]);
        let why: Vec<(IpAddr, &str)> = dropped.iter().map(|d| (d.ip, d.why.as_str())).collect();
        assert_eq!(
            why,
            vec![
                (ip("10.0.0.3"), "no longer held by the pod's netns"),
                (ip("10.0.0.4"), "the IP of another pod (amb/other)"),
                (ip("169.254.7.127"), "not a pod address (link-local)"),
                (ip("127.0.0.1"), "not a pod address (loopback)"),
            ]
        );
    }

    #[test]
    fn the_record_round_trips_and_is_read_bounded() {
        let record = Record::from([("u1".to_string(), vec![ip("10.0.0.1"), ip("10.0.0.2")])]);
        assert_eq!(decode(&encode(&record)).unwrap(), record);
        let odd = r#"{"version":1,"pods":{"u2":["10.0.0.9","nope",7],"":["10.0.0.8"],"u3":[]}}"#;
        assert_eq!(
            decode(odd).unwrap(),
            Record::from([("u2".to_string(), vec![ip("10.0.0.9")])])
        );
        assert!(decode(r#"{"version":2,"pods":{}}"#).is_err());
        assert!(decode("not json").is_err());
        let many: serde_json::Map<String, serde_json::Value> = (0..MAX_PODS + 10)
            .map(|i| (format!("u{i}"), serde_json::json!(["10.0.0.1"])))
            .collect();
        let text = serde_json::json!({"version": 1, "pods": many}).to_string();
        assert_eq!(decode(&text).unwrap().len(), MAX_PODS);
    }

    #[test]
    fn the_record_is_replaced_whole_and_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        let record = Record::from([("u1".to_string(), vec![ip("10.0.0.1"), ip("10.0.0.2")])]);
        write(dir.path(), &record).unwrap();
        assert_eq!(read(dir.path()).unwrap(), record);
        write(dir.path(), &Record::new()).unwrap();
        assert!(!dir.path().join(RECORD_FILE).exists());
        std::fs::write(dir.path().join(RECORD_FILE), vec![b' '; 2 << 20]).unwrap();
        assert!(matches!(
            read(dir.path()),
            Err(RecordError::TooLarge { .. })
        ));
        std::fs::remove_file(dir.path().join(RECORD_FILE)).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join(RECORD_FILE),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(matches!(
            read(dir.path()),
            Err(RecordError::NotAFile { .. })
        ));
    }
}
