//! Host facts that complete the settings: the proxy UID from the user database, IPv6 detection and
//! the DNS servers. Reads files and interface addresses; everything else is pure.

use std::net::IpAddr;

use super::error::CommandError;
use super::values::{DnsSource, Ipv6Choice, Settings};
use crate::netlink::{self, HostIp};

/// UID used when the proxy user cannot be looked up.
const FALLBACK_PROXY_UID: &str = "1337";

/// Completes `settings` from the host; returns the detected host IP (if any) for validation.
pub fn fill_host_facts(settings: &mut Settings) -> Result<Option<HostIp>, CommandError> {
    if let Some(user) = &settings.proxy_uid_from_user {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let uid = uid_of_user(&passwd, user).unwrap_or_else(|| FALLBACK_PROXY_UID.to_string());
        settings.capture.proxy_uids = vec![uid];
        if !settings.proxy_gid_given {
            settings.capture.proxy_gids = settings.capture.proxy_uids.clone();
        }
    }
    // Interface addresses are needed only to pick the IP family or the validation address.
    let detected = if settings.ipv6 == Ipv6Choice::Auto || settings.run_validation {
        netlink::detect_host_ip(settings.dual_stack).ok().flatten()
    } else {
        None
    };
    settings.capture.enable_ipv6 = match settings.ipv6 {
        Ipv6Choice::On => true,
        Ipv6Choice::Off => false,
        // Cleanup needs no address: it removes our IPv6 rules wherever it finds them anyway.
        Ipv6Choice::Auto if settings.cleanup_only => detected.is_some_and(|d| d.ipv6),
        Ipv6Choice::Auto => detected.ok_or(CommandError::NoHostAddress)?.ipv6,
    };
    if settings.capture.redirect_dns && !settings.capture.capture_all_dns {
        let servers = match &settings.dns {
            // Checked when the flags were resolved.
            DnsSource::Given(list) => list.clone(),
            DnsSource::ResolvConf => {
                let text = std::fs::read_to_string("/etc/resolv.conf")
                    .map_err(CommandError::ResolvConf)?;
                resolv_conf_servers(&text)
            }
        };
        let (v4, v6): (Vec<String>, Vec<String>) = servers
            .into_iter()
            .partition(|s| s.parse::<IpAddr>().map(|a| a.is_ipv4()).unwrap_or(false));
        settings.capture.dns_servers_v4 = v4;
        settings.capture.dns_servers_v6 = v6;
    }
    Ok(detected)
}

/// The UID of `user` in passwd-format text.
pub fn uid_of_user(passwd: &str, user: &str) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == user)
            .then(|| fields.nth(1).map(str::to_string))
            .flatten()
    })
}

/// The `nameserver` addresses of a resolv.conf, normalised the way Go's netip prints them
/// (unparsable entries dropped).
pub fn resolv_conf_servers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver")
                .then(|| words.next())
                .flatten()
        })
        .filter_map(|s| s.parse::<IpAddr>().ok())
        .map(|ip| ip.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_uid() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nistio-proxy:x:1337:1337::/home:/bin/false\n";
        assert_eq!(uid_of_user(passwd, "istio-proxy").as_deref(), Some("1337"));
        assert_eq!(uid_of_user(passwd, "nobody"), None);
    }

    #[test]
    fn resolv_conf_is_normalised_like_go() {
        let text = "# comment\nnameserver 10.96.0.10\nnameserver ::127.0.0.53\nnameserver FD00::0001\nnameserver bogus\nsearch x\n";
        assert_eq!(
            resolv_conf_servers(text),
            vec!["10.96.0.10", "::7f00:35", "fd00::1"]
        );
    }
}
