//! nft's JSON listing (`nft -j list ruleset`) read into [`super::NativeState`]: what the tests
//! compare the kernel's state with when nft itself wrote or listed it. The shipped build reads the
//! kernel over netlink instead ([`crate::rules::nft_kernel_decode`]), so this reader is test-only.

use serde_json::Value;

use super::{Hook, ListedRule, NativeState, canonical_addr};
use crate::rules::model::{Family, ForeignRule, Proto};
use crate::rules::nft_model::{
    AddrValue, MarkKey, MarkSource, MaskSpelling, MaskedMark, NftCtState, NftExpr, OwnerKind, Side,
};

/// Why a listing could not be read at all (not JSON, or not nft's layout).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nft JSON listing: {0}")]
pub struct BadListing(pub String);

/// Reads the tables named `<prefix>*` from `nft -j list ruleset` (or `list table`) output.
pub fn decode_listing(json: &str, prefix: &str) -> Result<NativeState, BadListing> {
    let root: Value = serde_json::from_str(json).map_err(|e| BadListing(e.to_string()))?;
    let objects = root
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| BadListing("no `nftables` array".into()))?;
    let mut state = NativeState::default();
    let key = |o: &Value, name_field: &str| -> Option<String> {
        let name = o.get(name_field)?.as_str()?;
        if !name.starts_with(prefix) {
            return None;
        }
        Some(match o.get("family").and_then(Value::as_str) {
            Some("inet") => name.to_string(),
            family => format!("{} {name}", family.unwrap_or("?")),
        })
    };
    for object in objects {
        let Some((kind, o)) = object.as_object().and_then(|m| m.iter().next()) else {
            continue;
        };
        let in_table = |field| key(o, field);
        match kind.as_str() {
            "table" => {
                if let Some(t) = in_table("name") {
                    state.tables.entry(t).or_default();
                }
            }
            "chain" => {
                let (Some(t), Some(name)) = (in_table("table"), str_of(o, "name")) else {
                    continue;
                };
                let hook = match (str_of(o, "type"), str_of(o, "hook")) {
                    (Some(kind), Some(hook)) => Some(Hook {
                        kind,
                        hook,
                        priority: o.get("prio").and_then(Value::as_i64).unwrap_or(i64::MIN),
                        policy: str_of(o, "policy").unwrap_or_else(|| "accept".into()),
                    }),
                    _ => None,
                };
                let chain = state
                    .tables
                    .entry(t)
                    .or_default()
                    .chains
                    .entry(name)
                    .or_default();
                chain.hook = hook;
            }
            "rule" => {
                let (Some(t), Some(name)) = (in_table("table"), str_of(o, "chain")) else {
                    continue;
                };
                let rule = decode_rule(o.get("expr"));
                let table = state.tables.entry(t).or_default();
                table.chains.entry(name).or_default().rules.push(rule);
            }
            "set" => {
                let (Some(t), Some(name)) = (in_table("table"), str_of(o, "name")) else {
                    continue;
                };
                let kind = match o.get("type") {
                    Some(Value::String(s)) => s.clone(),
                    other => other.map(Value::to_string).unwrap_or_default(),
                };
                state.tables.entry(t).or_default().sets.insert(name, kind);
            }
            _ => {}
        }
    }
    Ok(state)
}

fn str_of(o: &Value, field: &str) -> Option<String> {
    o.get(field).and_then(Value::as_str).map(String::from)
}

/// One rule's `expr` array.
fn decode_rule(exprs: Option<&Value>) -> ListedRule {
    let exprs = exprs
        .and_then(Value::as_array)
        .ok_or_else(|| ForeignRule("rule without statements".into()))?;
    exprs.iter().map(decode_statement).collect()
}

fn foreign<T>(what: &Value) -> Result<T, ForeignRule> {
    let mut text = what.to_string();
    text.truncate(120);
    Err(ForeignRule(text))
}

/// A JSON object with exactly one key: (key, value).
fn single(v: &Value) -> Option<(&str, &Value)> {
    let map = v.as_object()?;
    (map.len() == 1).then(|| map.iter().next().map(|(k, v)| (k.as_str(), v)))?
}

/// `{"meta": {"key": K}}` / `{"ct": {"key": K}}` -> ("meta"|"ct", K).
fn keyed(v: &Value) -> Option<(&str, &str)> {
    let (kind, body) = single(v)?;
    let body = body.as_object()?;
    if body.len() != 1 {
        return None;
    }
    Some((kind, body.get("key")?.as_str()?))
}

fn mark_key(v: &Value) -> Option<MarkKey> {
    match keyed(v)? {
        ("meta", "mark") => Some(MarkKey::Meta),
        ("ct", "mark") => Some(MarkKey::Ct),
        _ => None,
    }
}

fn u32_of(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn proto_of(name: &str) -> Option<Proto> {
    match name {
        "tcp" => Some(Proto::Tcp),
        "udp" => Some(Proto::Udp),
        _ => None,
    }
}

/// Only these fields (besides the ones read) may be present.
fn only(v: &Value, fields: &[&str]) -> bool {
    v.as_object()
        .is_some_and(|m| m.keys().all(|k| fields.contains(&k.as_str())))
}

fn decode_statement(stmt: &Value) -> Result<NftExpr, ForeignRule> {
    let Some((kind, body)) = single(stmt) else {
        return foreign(stmt);
    };
    let decoded = match kind {
        "match" => decode_match(body),
        "counter" => Some(NftExpr::Counter),
        "accept" => Some(NftExpr::Accept),
        "drop" => Some(NftExpr::Drop),
        "return" => Some(NftExpr::Return),
        "jump" if only(body, &["target"]) => str_of(body, "target").map(NftExpr::Jump),
        "redirect" if only(body, &["port"]) => body
            .get("port")
            .and_then(Value::as_u64)
            .map(|p| NftExpr::RedirectTo(p.to_string())),
        "tproxy" if only(body, &["family", "port"]) => {
            let family = match body.get("family").and_then(Value::as_str) {
                Some("ip") => Some(Family::V4),
                Some("ip6") => Some(Family::V6),
                _ => None,
            };
            family
                .zip(body.get("port").and_then(Value::as_u64))
                .map(|(family, port)| NftExpr::Tproxy {
                    family,
                    port: port.to_string(),
                })
        }
        "snat" if only(body, &["family", "addr"]) => body
            .get("addr")
            .and_then(Value::as_str)
            .map(|a| NftExpr::SnatTo(canonical_addr(a))),
        "mangle" if only(body, &["key", "value"]) => decode_mangle(&body["key"], &body["value"]),
        _ => None,
    };
    decoded.map_or_else(|| foreign(stmt), Ok)
}

fn decode_match(m: &Value) -> Option<NftExpr> {
    if !only(m, &["op", "left", "right"]) {
        return None;
    }
    let (left, right) = (m.get("left")?, m.get("right")?);
    let op = m.get("op")?.as_str()?;
    let negate = match op {
        "==" => false,
        "!=" => true,
        // `ct state a,b` is a bitmask test, listed as `in`.
        "in" => false,
        _ => return None,
    };
    if op == "in" {
        return (keyed(left)? == ("ct", "state")).then(|| ct_state(right))?;
    }
    if let Some((kind, key)) = keyed(left) {
        return match (kind, key) {
            ("meta", "l4proto") if !negate => {
                right.as_str().and_then(proto_of).map(NftExpr::L4Proto)
            }
            ("meta", "iifname") => right.as_str().map(|n| NftExpr::IifName {
                name: n.to_string(),
                negate,
            }),
            ("meta", "oifname") => right.as_str().map(|n| NftExpr::OifName {
                name: n.to_string(),
                negate,
            }),
            ("meta", owner @ ("skuid" | "skgid")) => Some(NftExpr::Owner {
                key: if owner == "skuid" {
                    OwnerKind::Uid
                } else {
                    OwnerKind::Gid
                },
                id: u32_of(right)?.to_string(),
                negate,
                with_meta: false,
            }),
            ("meta", "mark") | ("ct", "mark") => Some(NftExpr::Mark {
                key: mark_key(left)?,
                value: u32_of(right)?.to_string(),
                negate,
            }),
            ("ct", "state") if !negate => ct_state(right),
            _ => None,
        };
    }
    let (kind, body) = single(left)?;
    match kind {
        "payload" if only(body, &["protocol", "field"]) => {
            let protocol = body.get("protocol")?.as_str()?;
            let field = body.get("field")?.as_str()?;
            payload_match(protocol, field, right, negate)
        }
        "&" => {
            let [what, mask] = body.as_array()?.as_slice() else {
                return None;
            };
            Some(NftExpr::MarkMasked {
                key: mark_key(what)?,
                mark: MaskedMark {
                    value: u32_of(right)?,
                    mask: u32_of(mask)?,
                },
                negate,
                spelling: MaskSpelling::Ampersand,
            })
        }
        _ => None,
    }
}

fn payload_match(protocol: &str, field: &str, right: &Value, negate: bool) -> Option<NftExpr> {
    let family = match protocol {
        "ip" => Some(Family::V4),
        "ip6" => Some(Family::V6),
        _ => None,
    };
    let side = match field {
        "saddr" | "sport" => Side::Src,
        "daddr" | "dport" => Side::Dst,
        _ => return None,
    };
    if let Some(family) = family {
        if !field.ends_with("addr") {
            return None;
        }
        let value = match right {
            Value::String(s) => match s.strip_prefix('@') {
                Some(set) => AddrValue::Set(set.to_string()),
                None => AddrValue::Prefix(canonical_addr(s)),
            },
            Value::Object(_) => {
                let prefix = right.get("prefix").filter(|p| only(p, &["addr", "len"]))?;
                let addr = prefix.get("addr")?.as_str()?;
                let len = prefix.get("len")?.as_u64()?;
                AddrValue::Prefix(canonical_addr(&format!("{addr}/{len}")))
            }
            _ => return None,
        };
        return Some(NftExpr::Addr {
            family,
            side,
            value,
            negate,
        });
    }
    let proto = proto_of(protocol)?;
    if !field.ends_with("port") {
        return None;
    }
    let ports: Vec<u64> = match right {
        Value::Number(_) => vec![right.as_u64()?],
        Value::Object(_) => single(right)
            .filter(|(k, _)| *k == "set")?
            .1
            .as_array()?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<_>>()?,
        _ => return None,
    };
    Some(NftExpr::Port {
        proto,
        side,
        ports: ports.iter().map(u64::to_string).collect(),
        negate,
    })
}

fn ct_state(right: &Value) -> Option<NftExpr> {
    let names: Vec<&str> = match right {
        Value::String(s) => vec![s.as_str()],
        Value::Array(list) => list.iter().map(Value::as_str).collect::<Option<_>>()?,
        _ => return None,
    };
    let mut states = names
        .iter()
        .map(|n| match *n {
            "invalid" => Some(NftCtState::Invalid),
            "related" => Some(NftCtState::Related),
            "established" => Some(NftCtState::Established),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    states.sort();
    states.dedup();
    Some(NftExpr::CtState(states))
}

fn decode_mangle(key: &Value, value: &Value) -> Option<NftExpr> {
    let source = |other: MarkKey| -> Option<MarkSource> {
        if let Some(n) = u32_of(value) {
            return Some(MarkSource::Value(n.to_string()));
        }
        if mark_key(value) == Some(other) {
            return Some(MarkSource::Other);
        }
        // `ct mark & A | B`: the kernel's `(ct mark & M) ^ B`, listed with A = M | B.
        let [and, set] = single(value)
            .filter(|(k, _)| *k == "|")?
            .1
            .as_array()?
            .as_slice()
        else {
            return None;
        };
        let [what, keep] = single(and)
            .filter(|(k, _)| *k == "&")?
            .1
            .as_array()?
            .as_slice()
        else {
            return None;
        };
        if other != MarkKey::MetaShort || mark_key(what) != Some(MarkKey::Ct) {
            return None;
        }
        let (keep, set) = (u32_of(keep)?, u32_of(set)?);
        Some(MarkSource::Masked(MaskedMark {
            value: set,
            mask: !(keep & !set),
        }))
    };
    match keyed(key)? {
        ("ct", "zone") => value
            .as_u64()
            .and_then(|z| u16::try_from(z).ok())
            .map(NftExpr::CtZoneSet),
        ("meta", "mark") => source(MarkKey::Ct).map(NftExpr::MetaMarkSet),
        ("ct", "mark") => {
            // `ct mark set mark`: the other mark is the packet mark.
            if mark_key(value) == Some(MarkKey::Meta) {
                return Some(NftExpr::CtMarkSet(MarkSource::Other));
            }
            source(MarkKey::MetaShort).map(NftExpr::CtMarkSet)
        }
        _ => None,
    }
}
