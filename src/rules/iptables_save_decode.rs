//! The inverse of [`super::iptables`] for text: `iptables-save` output (or restore input) read
//! back into the typed rule model, as the same [`IptablesState`] the nf_tables dump gives, so one
//! comparison serves iptables-legacy and iptables-nft alike. Each rule is spelt as
//! [`canonical`] spells a plan (`-m tcp --dport` is `--dport`, marks in hex, `addr/prefix`
//! networks), and keeps its arguments as saved, which name it for `-D`. A rule holding anything
//! the model cannot say (another module, option or target) is a [`ForeignRule`]: it equals no
//! planned rule. Pure: text in, rules out.

use super::iptables_nft_decode::canonical;
use super::iptables_state::{DecodedRule, IptablesState, RuleAt};
use super::model::{
    CtState, ForeignRule, Match, Position, Proto, Rule, SetDir, Table, Target, is_builtin_chain,
};

/// The tables `*-save` output is read for.
const TABLES: [Table; 4] = [Table::Filter, Table::Mangle, Table::Nat, Table::Raw];

/// Reads `*-save` output (or `*-restore` input): the tables filter, mangle, nat and raw, their
/// chain declarations and policies, and their rules in order (an insert's position dropped, as
/// the kernel lists rules without one). One pass over the lines.
pub fn decode_save(text: &str) -> IptablesState {
    let mut state = IptablesState::default();
    let mut table: Option<Table> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            table = TABLES.into_iter().find(|t| t.name() == name.trim());
            continue;
        }
        let Some(t) = table else { continue };
        let name = t.name().to_string();
        if let Some(decl) = line.strip_prefix(':').or_else(|| line.strip_prefix("-N ")) {
            let mut words = decl.split_whitespace();
            if let Some(chain) = words.next() {
                let policy = words.next().unwrap_or("-");
                if is_builtin_chain(chain) && !matches!(policy, "ACCEPT" | "-") {
                    state
                        .not_accepting
                        .insert((name.clone(), chain.to_string()));
                }
                state.chains.insert((name, chain.to_string()));
            }
            continue;
        }
        // `-c`/`--counters` output starts a rule with `[packets:bytes]`.
        let line = match line.strip_prefix('[') {
            Some(rest) => rest.split_once("] ").map_or(line, |(_, rule)| rule),
            None => line,
        };
        let mut words = line.splitn(3, ' ');
        let (Some(op @ ("-A" | "-I")), Some(chain)) = (words.next(), words.next()) else {
            continue;
        };
        let mut args = words.next().unwrap_or("");
        if op == "-I"
            && let Some((pos, tail)) = args.split_once(' ')
            && pos.chars().all(|c| c.is_ascii_digit())
        {
            args = tail;
        }
        state.chains.insert((name, chain.to_string()));
        state.rules.push(decode_saved_rule(t, chain, args));
    }
    state
}

/// One saved rule (its arguments after `-A CHAIN`) of `table`.
pub fn decode_saved_rule(table: Table, chain: &str, args: &str) -> DecodedRule {
    let words = rule_words(args);
    let jumps_to = words
        .iter()
        .position(|w| w == "-j" || w == "-g")
        .and_then(|i| words.get(i + 1))
        .filter(|t| !matches!(t.as_str(), "ACCEPT" | "DROP" | "RETURN" | "QUEUE"))
        .cloned();
    let rule = decode_words(table, chain, &words).map(|r| canonical(&r));
    // A rule that names its chain's target without decoding (an extension) jumps nowhere.
    let jumps_to = match &rule {
        Ok(r) => r.target.jump_chain().map(String::from),
        Err(_) => jumps_to,
    };
    DecodedRule {
        table: table.name().to_string(),
        chain: chain.to_string(),
        at: RuleAt::SavedArgs(args.to_string()),
        jumps_to,
        rule,
    }
}

/// The words of a saved rule, walked once.
struct Words<'a> {
    words: &'a [String],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let word = self.words.get(self.at)?;
        self.at += 1;
        Some(word)
    }
    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.at).map(String::as_str)
    }
    fn value(&mut self, flag: &str) -> Result<String, ForeignRule> {
        self.next()
            .map(String::from)
            .ok_or_else(|| foreign(format!("{flag} without a value")))
    }
    /// `! --option` or `--option` of a module: the negation and the option, when one follows.
    fn option(&mut self) -> Option<(bool, &'a str)> {
        let negate = self.peek() == Some("!");
        let option = self.words.get(self.at + usize::from(negate))?;
        if !option.starts_with("--") {
            return None;
        }
        self.at += 1 + usize::from(negate);
        Some((negate, option))
    }
}

fn foreign(what: impl Into<String>) -> ForeignRule {
    ForeignRule(what.into())
}

/// The rule the words say, in the model (values as saved; the caller spells it canonically).
fn decode_words(table: Table, chain: &str, words: &[String]) -> Result<Rule, ForeignRule> {
    let mut w = Words { words, at: 0 };
    let mut matches = Vec::new();
    let mut proto = None;
    while let Some(word) = w.next() {
        let negate = word == "!";
        let flag = if negate {
            w.value("!")?
        } else {
            word.to_string()
        };
        match flag.as_str() {
            "-i" | "-o" | "-s" | "-d" => {
                let value = w.value(&flag)?;
                matches.push(match flag.as_str() {
                    "-i" => Match::InIface {
                        name: value,
                        negate,
                    },
                    "-o" => Match::OutIface {
                        name: value,
                        negate,
                    },
                    "-s" => Match::Src {
                        addr: value,
                        negate,
                    },
                    _ => Match::Dst {
                        addr: value,
                        negate,
                    },
                });
            }
            "-p" if !negate => {
                let p = protocol(&w.value("-p")?)?;
                proto = Some(p);
                matches.push(Match::Proto(p));
            }
            // The protocol's own port options, without `-m` (as restore input spells them).
            "--dport" | "--sport" if proto.is_some() => {
                let port = w.value(&flag)?;
                matches.push(match flag.as_str() {
                    "--dport" => Match::DstPort {
                        port,
                        negate,
                        module: None,
                    },
                    _ => Match::SrcPort {
                        port,
                        negate,
                        module: None,
                    },
                });
            }
            "-m" if !negate => {
                let module = w.value("-m")?;
                module_matches(&module, &mut w, proto, &mut matches)?;
            }
            "-j" if !negate => {
                let name = w.value("-j")?;
                let target = target(&name, &mut w)?;
                if let Some(rest) = w.next() {
                    return Err(foreign(format!("`{rest}` after the target")));
                }
                return Ok(Rule {
                    table,
                    chain: chain.to_string(),
                    position: Position::Append,
                    matches,
                    target,
                });
            }
            other => {
                return Err(foreign(format!(
                    "`{}{other}`",
                    if negate { "! " } else { "" }
                )));
            }
        }
    }
    Err(foreign("no target"))
}

fn protocol(name: &str) -> Result<Proto, ForeignRule> {
    match name {
        "tcp" | "6" => Ok(Proto::Tcp),
        "udp" | "17" => Ok(Proto::Udp),
        other => Err(foreign(format!("protocol {other}"))),
    }
}

/// The matches one `-m MODULE [options]` says.
fn module_matches(
    module: &str,
    w: &mut Words,
    proto: Option<Proto>,
    out: &mut Vec<Match>,
) -> Result<(), ForeignRule> {
    let mut said = 0;
    while let Some((negate, option)) = w.option() {
        said += 1;
        let value = |w: &mut Words| w.value(option);
        let m = match (module, option) {
            ("tcp" | "udp", "--dport" | "--sport") => {
                let port = value(w)?;
                let module = Some(protocol(module)?);
                match option {
                    "--dport" => Match::DstPort {
                        port,
                        negate,
                        module,
                    },
                    _ => Match::SrcPort {
                        port,
                        negate,
                        module,
                    },
                }
            }
            ("multiport", "--dports") => Match::DstPorts {
                ports: value(w)?.split(',').map(String::from).collect(),
                negate,
            },
            ("owner", "--uid-owner") => Match::UidOwner {
                id: value(w)?,
                negate,
            },
            ("owner", "--gid-owner") => Match::GidOwner {
                id: value(w)?,
                negate,
            },
            ("owner", "--socket-exists") if !negate => Match::SocketExists,
            ("mark", "--mark") => Match::Mark {
                value: value(w)?,
                negate,
            },
            ("connmark", "--mark") if !negate => Match::ConnMark { value: value(w)? },
            ("conntrack", "--ctstate") if !negate => Match::CtState(ct_states(&value(w)?)?),
            ("set", "--match-set") if !negate => {
                let name = value(w)?;
                let dir = match value(w)?.as_str() {
                    "src" => SetDir::Src,
                    "dst" => SetDir::Dst,
                    other => return Err(foreign(format!("set direction {other}"))),
                };
                Match::InSet { name, dir }
            }
            _ => {
                let not = if negate { "! " } else { "" };
                return Err(foreign(format!("-m {module} {not}{option}")));
            }
        };
        out.push(m);
    }
    match module {
        // `-p tcp -m tcp` alone: the protocol module without ports.
        "tcp" | "udp" if said == 0 && proto == Some(protocol(module)?) => {
            out.push(Match::ProtoModule(protocol(module)?));
            Ok(())
        }
        _ if said == 0 => Err(foreign(format!("-m {module}"))),
        _ => Ok(()),
    }
}

fn ct_states(list: &str) -> Result<Vec<CtState>, ForeignRule> {
    list.split(',')
        .map(|s| match s {
            "INVALID" => Ok(CtState::Invalid),
            "RELATED" => Ok(CtState::Related),
            "ESTABLISHED" => Ok(CtState::Established),
            other => Err(foreign(format!("conntrack state {other}"))),
        })
        .collect()
}

/// `0x…` or decimal.
fn number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A target's options, each `--option [value]`, taken out one by one.
struct TargetOptions<'a>(Vec<(&'a str, Option<&'a str>)>);

impl<'a> TargetOptions<'a> {
    /// The option: `Some(value)` when it is there (a flag's value is None).
    fn take(&mut self, option: &str) -> Option<Option<&'a str>> {
        let i = self.0.iter().position(|(o, _)| *o == option)?;
        Some(self.0.swap_remove(i).1)
    }
    fn value(&mut self, option: &str) -> Option<&'a str> {
        self.take(option).flatten()
    }
    /// CONNMARK's `--nfmask`/`--ctmask`: Some(false) when absent, Some(true) when both are all
    /// ones (what the model says), None otherwise.
    fn full_masks(&mut self) -> Option<bool> {
        let full = |m: Option<&str>| m.and_then(number) == Some(u32::MAX);
        match (self.take("--nfmask"), self.take("--ctmask")) {
            (None, None) => Some(false),
            (Some(nf), Some(ct)) => (full(nf) && full(ct)).then_some(true),
            _ => None,
        }
    }
}

/// The target `-j NAME [options]` says; the options in any order, each once.
fn target(name: &str, w: &mut Words) -> Result<Target, ForeignRule> {
    let mut options = TargetOptions(Vec::new());
    while let Some((negate, option)) = w.option() {
        if negate {
            return Err(foreign(format!("-j {name} ! {option}")));
        }
        let value = w.peek().filter(|v| !v.starts_with("--"));
        if value.is_some() {
            w.next();
        }
        options.0.push((option, value));
    }
    let o = &mut options;
    let target = match name {
        "ACCEPT" => Some(Target::Accept),
        "DROP" => Some(Target::Drop),
        "RETURN" => Some(Target::Return),
        "REDIRECT" => match (o.take("--to-ports"), o.take("--to-port")) {
            (Some(Some(port)), None) => Some(Target::Redirect {
                port: port.into(),
                plural: true,
            }),
            (None, Some(Some(port))) => Some(Target::Redirect {
                port: port.into(),
                plural: false,
            }),
            _ => None,
        },
        "TPROXY" => {
            let any_ip = matches!(o.take("--on-ip"), None | Some(Some("0.0.0.0" | "::")));
            match (o.value("--on-port"), o.value("--tproxy-mark")) {
                (Some(port), Some(mark)) if any_ip => Some(Target::Tproxy {
                    mark: mark.into(),
                    port: port.into(),
                }),
                _ => None,
            }
        }
        "MARK" => match (o.take("--set-mark"), o.take("--set-xmark")) {
            (Some(Some(mark)), None) => Some(Target::SetMark(mark.into())),
            // `--set-mark V/M` is saved as `--set-xmark V/(V|M)`: any other xmark is not a set.
            (None, Some(Some(xmark))) => xmark
                .split_once('/')
                .and_then(|(v, m)| Some((number(v)?, number(m)?)))
                .filter(|(v, m)| v & !m == 0)
                .map(|_| Target::SetMark(xmark.into())),
            _ => None,
        },
        "CONNMARK" => match (
            o.take("--set-xmark"),
            o.take("--save-mark"),
            o.take("--restore-mark"),
        ) {
            (Some(Some(mark)), None, None) => Some(Target::ConnmarkSetXmark(mark.into())),
            (None, Some(None), None) => o.full_masks().map(|_| Target::ConnmarkSave),
            (None, None, Some(None)) => o
                .full_masks()
                .map(|masks| Target::ConnmarkRestore { masks }),
            _ => None,
        },
        "CT" => o
            .value("--zone")
            .and_then(|z| z.parse().ok())
            .map(Target::CtZone),
        "SNAT" => o.value("--to-source").map(|a| Target::Snat(a.into())),
        chain if o.0.is_empty() => Some(Target::Jump(chain.into())),
        _ => None,
    };
    match target {
        Some(t) if options.0.is_empty() => Ok(t),
        _ => Err(foreign(format!("target {name}"))),
    }
}

/// The `*table` … `COMMIT` section of one table in `*-save` output (comments dropped), or None.
pub fn table_section(save: &str, table: &str) -> Option<String> {
    let mut out = String::new();
    let mut inside = false;
    for line in save.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            inside = name.trim() == table;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
            if line.trim() == "COMMIT" {
                return Some(out);
            }
        }
    }
    None
}

/// A saved rule's arguments as a command line takes them: split on spaces, except inside double
/// quotes (`--comment "a b"`), with the quotes removed.
pub fn rule_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped, mut started) = (false, false, false);
    for c in rule.chars() {
        match c {
            _ if escaped => {
                word.push(c);
                escaped = false;
            }
            '\\' if quoted => escaped = true,
            '"' => {
                quoted = !quoted;
                started = true;
            }
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            _ => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

#[cfg(test)]
#[path = "iptables_save_decode_tests.rs"]
mod tests;
