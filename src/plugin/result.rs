//! CNI results: the previous plugin's result is read in the config's spec version and printed
//! again in that version (as libcni's typed round trip does: unknown fields dropped, layout
//! normalised); without one, an empty result is printed.
//!
//! Three layouts exist: 0.1.0/0.2.0 (`ip4`/`ip6` objects), 0.3.x/0.4.0 (`interfaces`/`ips` with a
//! per-IP `version`) and 1.x (no `version`; 1.1 adds MTU and route attributes). Everything is
//! parsed into the 1.x shape and written back out in the requested layout.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::cni::{CniError, code};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "String::is_empty"
    )]
    pub socket_path: String,
    #[serde(default, rename = "pciID", skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<i64>,
    pub address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gw: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: u64,
    #[serde(default, rename = "advmss", skip_serializing_if = "is_zero")]
    pub adv_mss: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A result in the 1.x shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// The layout family of a spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    V02,
    V04,
    V1,
}

fn layout(version: &str) -> Result<Layout, CniError> {
    match version {
        "0.1.0" | "0.2.0" => Ok(Layout::V02),
        "0.3.0" | "0.3.1" | "0.4.0" => Ok(Layout::V04),
        "1.0.0" | "1.1.0" => Ok(Layout::V1),
        other => Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("unsupported CNI result version {other:?}"),
        )),
    }
}

/// 0.1/0.2 per-family block.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Ip02 {
    ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    gateway: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route02>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Route02 {
    dst: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    gw: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Result02 {
    #[serde(default)]
    ip4: Option<Ip02>,
    #[serde(default)]
    ip6: Option<Ip02>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ResultCurrent {
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<IpConfig>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Dns,
}

fn decode_err(e: impl std::fmt::Display) -> CniError {
    CniError::new(
        code::DECODING_FAILURE,
        format!("could not parse prevResult: {e}"),
    )
}

fn is_v6(cidr_or_ip: &str) -> bool {
    cidr_or_ip.contains(':')
}

/// Checks that an address is `ip/prefix` and returns whether it is IPv6.
fn check_cidr(addr: &str) -> Result<bool, CniError> {
    addr.parse::<ipnet::IpNet>()
        .map(|n| matches!(n, ipnet::IpNet::V6(_)))
        .map_err(|_| decode_err(format!("invalid CIDR address {addr:?}")))
}

impl CniResult {
    /// Parses a result laid out as `version` prescribes.
    pub fn parse(value: &Value, version: &str) -> Result<CniResult, CniError> {
        let value = &canonical_keys(value, RESULT_KEYS);
        let result = match layout(version)? {
            Layout::V02 => {
                let old: Result02 = serde_json::from_value(value.clone()).map_err(decode_err)?;
                let mut r = CniResult {
                    dns: old.dns,
                    ..Default::default()
                };
                for block in [old.ip4, old.ip6].into_iter().flatten() {
                    r.ips.push(IpConfig {
                        interface: None,
                        address: block.ip,
                        gateway: block.gateway,
                    });
                    r.routes.extend(block.routes.into_iter().map(|rt| Route {
                        dst: rt.dst,
                        gw: rt.gw,
                        ..Default::default()
                    }));
                }
                r
            }
            Layout::V04 | Layout::V1 => {
                let cur: ResultCurrent =
                    serde_json::from_value(value.clone()).map_err(decode_err)?;
                CniResult {
                    interfaces: cur.interfaces,
                    ips: cur.ips,
                    routes: cur.routes,
                    dns: cur.dns,
                }
            }
        };
        for ip in &result.ips {
            check_cidr(&ip.address)?;
        }
        for route in &result.routes {
            check_cidr(&route.dst)?;
        }
        Ok(result)
    }

    /// The result laid out for `version`, with `cniVersion` set.
    pub fn to_version(&self, version: &str) -> Result<Value, CniError> {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), version.into());
        match layout(version)? {
            Layout::V02 => {
                let block = |v6: bool| {
                    self.ips
                        .iter()
                        .find(|ip| is_v6(&ip.address) == v6)
                        .map(|ip| Ip02 {
                            ip: ip.address.clone(),
                            gateway: ip.gateway.clone(),
                            routes: self
                                .routes
                                .iter()
                                .filter(|r| is_v6(&r.dst) == v6)
                                .map(|r| Route02 {
                                    dst: r.dst.clone(),
                                    gw: r.gw.clone(),
                                })
                                .collect(),
                        })
                };
                if let Some(b) = block(false) {
                    obj.insert("ip4".into(), to_value(&b));
                }
                if let Some(b) = block(true) {
                    obj.insert("ip6".into(), to_value(&b));
                }
            }
            Layout::V04 => {
                if !self.interfaces.is_empty() {
                    let list: Vec<Value> = self
                        .interfaces
                        .iter()
                        .map(|i| {
                            // 0.4 interfaces know only name, mac and sandbox.
                            to_value(&Interface {
                                name: i.name.clone(),
                                mac: i.mac.clone(),
                                sandbox: i.sandbox.clone(),
                                ..Default::default()
                            })
                        })
                        .collect();
                    obj.insert("interfaces".into(), Value::Array(list));
                }
                if !self.ips.is_empty() {
                    let list: Vec<Value> = self
                        .ips
                        .iter()
                        .map(|ip| {
                            let mut v = to_value(ip);
                            if let Value::Object(m) = &mut v {
                                let family = if is_v6(&ip.address) { "6" } else { "4" };
                                m.insert("version".into(), family.into());
                            }
                            v
                        })
                        .collect();
                    obj.insert("ips".into(), Value::Array(list));
                }
                if !self.routes.is_empty() {
                    let list: Vec<Value> = self
                        .routes
                        .iter()
                        .map(|r| {
                            to_value(&Route {
                                dst: r.dst.clone(),
                                gw: r.gw.clone(),
                                ..Default::default()
                            })
                        })
                        .collect();
                    obj.insert("routes".into(), Value::Array(list));
                }
            }
            Layout::V1 => {
                if !self.interfaces.is_empty() {
                    obj.insert("interfaces".into(), to_value(&self.interfaces));
                }
                if !self.ips.is_empty() {
                    obj.insert("ips".into(), to_value(&self.ips));
                }
                if !self.routes.is_empty() {
                    obj.insert("routes".into(), to_value(&self.routes));
                }
            }
        }
        // libcni's 0.x types always print the DNS struct; its 1.x types leave out an empty one.
        if layout(version)? != Layout::V1 || self.dns != Dns::default() {
            obj.insert("dns".into(), to_value(&self.dns));
        }
        Ok(Value::Object(obj))
    }
}

/// Serialising these plain structs to a `Value` cannot fail; keep the conversion in one place.
fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Every key a result may carry, in its canonical spelling.
const RESULT_KEYS: &[&str] = &[
    "cniVersion",
    "interfaces",
    "ips",
    "routes",
    "dns",
    "name",
    "mac",
    "mtu",
    "sandbox",
    "socketPath",
    "pciID",
    "interface",
    "address",
    "gateway",
    "version",
    "dst",
    "gw",
    "advmss",
    "priority",
    "table",
    "scope",
    "nameservers",
    "domain",
    "search",
    "options",
    "ip4",
    "ip6",
    "ip",
];

/// Go's JSON decoding matches keys case-insensitively (Istio's own tests send `cniversion`); give
/// every known key its canonical spelling, recursively, unless that spelling is already present.
pub fn canonical_keys(value: &Value, keys: &[&str]) -> Value {
    match value {
        Value::Object(obj) => {
            let mut out = Map::new();
            for (k, v) in obj {
                let canonical = keys
                    .iter()
                    .find(|c| c.eq_ignore_ascii_case(k))
                    .filter(|c| **c == k || !obj.contains_key(**c))
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| k.clone());
                out.insert(canonical, canonical_keys(v, keys));
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| canonical_keys(v, keys)).collect())
        }
        other => other.clone(),
    }
}

/// The stdout result of a successful ADD: the previous result passed on in the config's version,
/// or an empty one.
pub fn pass_through(prev: Option<&Value>, version: &str) -> Result<Value, CniError> {
    let result = match prev {
        Some(v) => CniResult::parse(v, source_version(v, version))?,
        None => CniResult::default(),
    };
    result.to_version(version)
}

/// The layout a previous result is written in: its own `cniVersion` when it names one we know
/// (libcni errors on a mismatch; converting is kinder), else the config's.
pub fn source_version<'a>(prev: &'a Value, config_version: &'a str) -> &'a str {
    let own = prev.as_object().and_then(|o| {
        o.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("cniVersion"))
            .and_then(|(_, v)| v.as_str())
    });
    match own {
        Some(v) if super::cni::SUPPORTED_VERSIONS.contains(&v) => v,
        _ => config_version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prev_1() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/var/run/netns/x", "mtu": 1500}],
            "ips": [
                {"interface": 0, "address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                {"interface": 0, "address": "fd00::2/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}, {"dst": "::/0"}],
            "dns": {"nameservers": ["10.0.0.10"]},
            "someFutureField": true
        })
    }

    #[test]
    fn empty_results_per_version() {
        assert_eq!(
            pass_through(None, "1.0.0").unwrap(),
            json!({"cniVersion": "1.0.0"})
        );
        assert_eq!(
            pass_through(None, "0.2.0").unwrap(),
            json!({"cniVersion": "0.2.0", "dns": {}})
        );
    }

    #[test]
    fn same_version_round_trip_drops_unknown_fields() {
        let out = pass_through(Some(&prev_1()), "1.0.0").unwrap();
        let mut expected = prev_1();
        expected.as_object_mut().unwrap().remove("someFutureField");
        assert_eq!(out, expected);
    }

    #[test]
    fn v04_layout_adds_ip_versions_and_drops_new_fields() {
        let r = CniResult::parse(&prev_1(), "1.0.0").unwrap();
        let out = r.to_version("0.4.0").unwrap();
        assert_eq!(out["ips"][0]["version"], "4");
        assert_eq!(out["ips"][1]["version"], "6");
        assert!(out["interfaces"][0].get("mtu").is_none());
        assert_eq!(out["interfaces"][0]["sandbox"], "/var/run/netns/x");
        let back = CniResult::parse(&out, "0.4.0").unwrap();
        assert_eq!(back.ips, r.ips);
    }

    #[test]
    fn v02_layout_splits_families() {
        let r = CniResult::parse(&prev_1(), "1.0.0").unwrap();
        let out = r.to_version("0.2.0").unwrap();
        assert_eq!(
            out,
            json!({
                "cniVersion": "0.2.0",
                "ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}]},
                "ip6": {"ip": "fd00::2/64", "routes": [{"dst": "::/0"}]},
                "dns": {"nameservers": ["10.0.0.10"]}
            })
        );
        let back = CniResult::parse(&out, "0.2.0").unwrap();
        let addresses: Vec<&str> = back.ips.iter().map(|ip| ip.address.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.2/24", "fd00::2/64"]);
    }

    #[test]
    fn a_prev_result_of_another_version_is_converted() {
        let prev = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.5/16"}, "dns": {}});
        let out = pass_through(Some(&prev), "1.0.0").unwrap();
        assert_eq!(
            out,
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/16"}]})
        );
        let out = pass_through(Some(&prev_1()), "0.4.0").unwrap();
        assert_eq!(out["cniVersion"], "0.4.0");
        assert_eq!(out["ips"][0]["version"], "4");
    }

    #[test]
    fn keys_match_case_insensitively_like_go() {
        // The shape of Istio's own plugin test config.
        let prev = json!({
            "cniversion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/tmp"}],
            "IPs": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
            "routes": []
        });
        let out = pass_through(Some(&prev), "1.0.0").unwrap();
        assert_eq!(out["ips"][0]["address"], "10.0.0.2/24");
        assert_eq!(out["interfaces"][0]["sandbox"], "/tmp");
        assert!(out.get("routes").is_none());
    }

    #[test]
    fn bad_addresses_are_decoding_errors() {
        let bad = json!({"ips": [{"address": "10.0.0.300/24"}]});
        let err = pass_through(Some(&bad), "1.0.0").unwrap_err();
        assert_eq!(err.code, code::DECODING_FAILURE);
        let bad = json!({"ips": "nope"});
        assert!(pass_through(Some(&bad), "1.0.0").is_err());
    }
}
