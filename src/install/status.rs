//! `install-cni status`: asks the running node agent for `/debug/pods` on its health port and
//! prints this node's pods as a table ([`render`], pure) or the JSON answer as it came.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::config::StatusRequest;
use crate::agent::node_pods::{Mode, SidecarState};
use crate::agent::ports::Delivery;
use crate::agent::status::{Check, CheckResult, DebugPods};

/// Why no table could be printed; each names the address asked.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(
        "the install-cni agent is not running at {addr} (connecting: {source}); run this inside \
         the istio-cni-node pod, or pass --health-port/--address"
    )]
    NotRunning {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the install-cni agent at {addr} did not answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("the ambient node agent is not running at {addr} (HTTP {status}: {body})")]
    AgentOff {
        addr: SocketAddr,
        status: u16,
        body: String,
    },
    #[error("GET http://{addr}/debug/pods failed: {reason}")]
    Http { addr: SocketAddr, reason: String },
    #[error("GET http://{addr}/debug/pods: unexpected answer: {reason}")]
    Answer { addr: SocketAddr, reason: String },
}

/// Answers larger than this are refused (a node holds a few hundred pods).
const MAX_BODY: usize = 16 << 20;

/// Runs the command; the exit code.
pub fn main(req: StatusRequest) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("install-cni status: building the async runtime: {e}");
            return 1;
        }
    };
    let answer = rt.block_on(fetch(req.address, req.timeout));
    match answer.and_then(|body| output(&body, req.json, req.address)) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("install-cni status: {e}");
            1
        }
    }
}

fn output(body: &str, json: bool, addr: SocketAddr) -> Result<String, StatusError> {
    let bad = |e: serde_json::Error| StatusError::Answer {
        addr,
        reason: e.to_string(),
    };
    let pods: DebugPods = serde_json::from_str(body).map_err(bad)?;
    if json {
        // As the agent sent it (fields this binary does not know are kept), one document.
        let value: serde_json::Value = serde_json::from_str(body).map_err(bad)?;
        let mut text = serde_json::to_string_pretty(&value).map_err(bad)?;
        text.push('\n');
        return Ok(text);
    }
    Ok(render(&pods, now_ms()))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One GET on a fresh connection, bounded by `timeout` as a whole.
async fn fetch(addr: SocketAddr, timeout: Duration) -> Result<String, StatusError> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| StatusError::NotRunning { addr, source })?;
        let http = |e: hyper::Error| StatusError::Http {
            addr,
            reason: e.to_string(),
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(async move {
            // Ends with the exchange; its errors surface on the request.
            let _ = conn.await;
        });
        let request = hyper::Request::get("/debug/pods")
            .header("Host", addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| StatusError::Http {
                addr,
                reason: e.to_string(),
            })?;
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .map_err(|e| StatusError::Http {
                addr,
                reason: format!("reading the answer: {e}"),
            })?;
        match status {
            200 => Ok(body),
            503 | 404 => Err(StatusError::AgentOff {
                addr,
                status,
                body: body.trim().to_string(),
            }),
            _ => Err(StatusError::Answer {
                addr,
                reason: format!("HTTP {status}: {}", body.trim()),
            }),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| StatusError::Timeout { addr, timeout })?
}

fn ago(at_unix_ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(at_unix_ms) / 1000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}m ago", s / 60),
        _ => format!("{}h ago", s / 3600),
    }
}

fn check_cell(c: &Check, now_ms: u64) -> String {
    let result = match &c.result {
        CheckResult::InPlace => "in_place",
        CheckResult::Repaired { .. } => "repaired",
        CheckResult::Failed { .. } => "failed",
    };
    format!("{result} {}", ago(c.at_unix_ms, now_ms))
}

/// What a check adds below the table (the text of a repair or a failure).
fn check_note(c: &Check) -> Option<String> {
    match &c.result {
        CheckResult::InPlace => None,
        CheckResult::Repaired { what } => Some(format!("repaired: {what}")),
        CheckResult::Failed { error } => Some(format!("failed: {error}")),
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Ambient => "ambient",
        Mode::Sidecar => "sidecar",
        Mode::None => "none",
    }
}

const HEADER: [&str; 8] = [
    "NAMESPACE/NAME",
    "MODE",
    "ENROLLED",
    "REASON",
    "NETNS",
    "IPS",
    "VERIFIED",
    "ZDS",
];

/// The table (pure): enrolled pods first, then the node's other pods; notes for anything whose
/// text does not fit a cell.
pub fn render(d: &DebugPods, now_ms: u64) -> String {
    let mut rows: Vec<[String; 8]> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for p in &d.pods {
        let id = format!("{}/{}", p.namespace, p.name);
        let zds = match &p.zds {
            None => "not sent".to_string(),
            Some(z) => {
                let state = match &z.delivery {
                    Delivery::Sent => "sent",
                    Delivery::Acked => "acked",
                    Delivery::Nacked { message } => {
                        notes.push(format!("{id}: ztunnel rejected it: {message}"));
                        "nacked"
                    }
                    Delivery::Lost => "lost",
                };
                format!("{} {state} (conn {})", z.request, z.connection)
            }
        };
        if let Some(n) = p.last_verified.as_ref().and_then(check_note) {
            notes.push(format!("{id}: last verification {n}"));
        }
        rows.push([
            id,
            "ambient".into(),
            "yes".into(),
            "-".into(),
            p.netns
                .as_ref()
                .map_or("not found".into(), |n| n.inode.to_string()),
            join_or_dash(&p.ips),
            p.last_verified
                .as_ref()
                .map_or("-".into(), |c| check_cell(c, now_ms)),
            zds,
        ]);
    }
    for p in &d.not_enrolled {
        let reason = match (&p.sidecar, p.mode) {
            (Some(s), Mode::Sidecar) => sidecar_cell(s),
            _ => p.reason.clone(),
        };
        rows.push([
            format!("{}/{}", p.namespace, p.name),
            mode_name(p.mode).into(),
            "no".into(),
            reason,
            "-".into(),
            join_or_dash(&p.ips),
            "-".into(),
            "-".into(),
        ]);
    }
    let mut out = match &d.host_rules {
        Some(c) => format!("host probe rules: {}\n", check_cell(c, now_ms)),
        None => "host probe rules: not verified yet\n".to_string(),
    };
    if let Some(n) = d.host_rules.as_ref().and_then(check_note) {
        notes.insert(0, format!("host probe rules: {n}"));
    }
    if rows.is_empty() {
        out.push_str("no pods on this node\n");
    } else {
        out.push_str(&table(&rows));
    }
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// What is known of a sidecar pod's redirection: redirected only when it is known to be.
fn sidecar_cell(s: &SidecarState) -> String {
    if s.redirected {
        return "sidecar: redirected by the plugin at ADD".to_string();
    }
    match (&s.failed, &s.skipped, s.state.as_str()) {
        (Some(why), _, _) => format!("sidecar redirection failed: {why}"),
        (None, Some(why), _) => format!("sidecar not redirected: {why}"),
        (None, None, "pending") => "sidecar: waiting for the pod's network (ADD)".to_string(),
        _ => "sidecar: redirection not known".to_string(),
    }
}

fn join_or_dash(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// The widest a pod's `namespace/name` is printed: Kubernetes allows 317 characters, and every row
/// is padded to the longest; a longer one is cut with an ellipsis (`--json` has it whole).
const NAME_WIDTH: usize = 48;

/// `cell` cut to `max` characters, the last one an ellipsis when anything was cut.
fn fit(cell: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if cell.chars().count() <= max {
        return cell.into();
    }
    let mut cut: String = cell.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut.into()
}

fn table(rows: &[[String; 8]]) -> String {
    let rows: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r[0] = fit(&r[0], NAME_WIDTH).into_owned();
            r
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 8]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(HEADER);
    for r in &rows {
        out.push_str(&line(r.each_ref().map(String::as_str)));
    }
    out
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
