//! Generated install-cni inputs: a CNI config dir (`.conf` and `.conflist` files, chained lists
//! with and without an old `istio-cni` entry, invalid files, odd but valid JSON: unicode in both
//! spellings, deep nesting, big and fractional numbers, any key order, any whitespace) and the
//! settings both installers get. Seeded: the same seed gives the same cases.

// One generator for the three differential tests; each uses part of it.
#[allow(dead_code)]
#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

/// One file of the generated conf dir.
#[derive(Clone, Debug)]
pub struct GenFile {
    pub name: String,
    pub text: String,
    pub mode: u32,
}

/// One generated input: the conf dir and the settings, the same for both installers.
#[derive(Clone, Debug)]
pub struct Case {
    pub files: Vec<GenFile>,
    pub chained: bool,
    pub conf_name: Option<String>,
    /// `ISTIO_OWNED_CNI_CONFIG=true` (owned mode itself also needs ambient).
    pub owned_flag: bool,
    /// `AMBIENT_ENABLED=true`: with the owned flag and chained, Istio's owned-config mode (a
    /// conflist of its own instead of merging into the primary's). Both installers then run as
    /// a node's agent (node netns, the real API server with the chart's RBAC, a ZDS peer).
    pub ambient: bool,
    /// `ISTIO_OWNED_CNI_CONFIG_FILENAME` (only drawn in owned-mode cases).
    pub owned_name: Option<String>,
    pub group_read: bool,
    pub exclude: Option<String>,
}

impl Case {
    /// The settings both get, as environment variables.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("CHAINED_CNI_PLUGIN".to_string(), self.chained.to_string())];
        if let Some(n) = &self.conf_name {
            env.push(("CNI_CONF_NAME".into(), n.clone()));
        }
        if self.owned_flag {
            env.push(("ISTIO_OWNED_CNI_CONFIG".into(), "true".into()));
        }
        if self.ambient {
            env.push(("AMBIENT_ENABLED".into(), "true".into()));
        }
        if let Some(n) = &self.owned_name {
            env.push(("ISTIO_OWNED_CNI_CONFIG_FILENAME".into(), n.clone()));
        }
        if self.group_read {
            env.push(("CNI_CONF_GROUP_READ".into(), "true".into()));
        }
        if let Some(e) = &self.exclude {
            env.push(("EXCLUDE_NAMESPACES".into(), e.clone()));
        }
        env
    }

    /// Smaller cases that may still fail the same way, simplest first.
    pub fn shrinks(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for i in 0..self.files.len() {
            let mut c = self.clone();
            c.files.remove(i);
            out.push(c);
        }
        let toggles: [fn(&mut Case) -> bool; 6] = [
            |c| c.conf_name.take().is_some(),
            |c| c.owned_name.take().is_some(),
            |c| std::mem::replace(&mut c.ambient, false),
            |c| std::mem::replace(&mut c.owned_flag, false),
            |c| std::mem::replace(&mut c.group_read, false),
            |c| c.exclude.take().is_some(),
        ];
        for t in toggles {
            let mut c = self.clone();
            if t(&mut c) {
                out.push(c);
            }
        }
        for i in 0..self.files.len() {
            if self.files[i].mode != 0o644 {
                let mut c = self.clone();
                c.files[i].mode = 0o644;
                out.push(c);
            }
        }
        out
    }

    pub fn describe(&self) -> String {
        let mut s = format!("env: {:?}\n", self.env());
        for f in &self.files {
            s += &format!("--- {} (mode {:o})\n{}\n", f.name, f.mode, f.text);
        }
        s
    }
}

/// A JSON value kept as written: numbers as their source text, objects in a chosen order.
#[derive(Clone, Debug)]
enum J {
    Null,
    Bool(bool),
    Num(&'static str),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "42",
    "1500",
    "1.5",
    "-0.25",
    "1e3",
    "2.5E-3",
    "1.0",
    "0.1",
    "12345678901234567890",
    "9007199254740993",
    "100000000000000000000000",
    "-0",
    "3.141592653589793238",
];

const STRINGS: &[&str] = &[
    "plain",
    "ünïcödé",
    "中文网络",
    "emoji 🚀",
    "<tag>&amp;",
    "line\u{2028}sep",
    "quote\"back\\slash",
    "tab\tnew\nline",
    "ctl\u{1}x",
    "",
    "/var/lib/cni/networks",
    "10.244.0.0/16",
];

const KEYS: &[&str] = &[
    "mtu",
    "a",
    "z",
    "B",
    "_x",
    "ключ",
    "key with space",
    "ipMasq",
    "capabilities",
    "日本",
    "",
    "zz~",
];

fn scalar(rng: &mut Rng) -> J {
    match rng.below(4) {
        0 => J::Null,
        1 => J::Bool(rng.chance(50)),
        2 => J::Num(rng.word(NUMBERS)),
        _ => J::Str(rng.pick(STRINGS).to_string()),
    }
}

fn value(rng: &mut Rng, depth: usize) -> J {
    if depth == 0 || rng.chance(45) {
        return scalar(rng);
    }
    let n = rng.below(4);
    if rng.chance(40) {
        J::Arr((0..n).map(|_| value(rng, depth - 1)).collect())
    } else {
        let mut fields: Vec<(String, J)> = Vec::new();
        for _ in 0..n {
            let k = rng.pick(KEYS).to_string();
            if fields.iter().all(|(f, _)| *f != k) {
                fields.push((k, value(rng, depth - 1)));
            }
        }
        J::Obj(fields)
    }
}

/// Extra fields for a config object (keys that CNI does not own), possibly deep.
fn extras(rng: &mut Rng, fields: &mut Vec<(String, J)>, taken: &[&str]) {
    let n = rng.below(3);
    for _ in 0..n {
        let k = rng.pick(KEYS).to_string();
        if !taken.contains(&k.as_str()) && fields.iter().all(|(f, _)| *f != k) {
            let depth = if rng.chance(15) { 8 } else { 3 };
            fields.push((k, value(rng, depth)));
        }
    }
}

fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
}

fn s(v: &str) -> J {
    J::Str(v.to_string())
}

fn plugin(rng: &mut Rng, with_version: bool) -> J {
    let mut f = vec![(
        "type".to_string(),
        s(rng.word(&["bridge", "ptp", "calico", "portmap", "tuning", "bandwidth"])),
    )];
    if with_version {
        f.push((
            "cniVersion".into(),
            s(rng.word(&["0.3.1", "0.4.0", "1.0.0"])),
        ));
    }
    if rng.chance(50) {
        f.push(("name".into(), s(rng.word(&["net", "k8s", "calico"]))));
    }
    if rng.chance(40) {
        f.push((
            "ipam".into(),
            J::Obj(vec![
                ("type".into(), s("host-local")),
                ("subnet".into(), s("10.244.1.0/24")),
            ]),
        ));
    }
    extras(rng, &mut f, &["type", "cniVersion", "name", "ipam"]);
    shuffle(rng, &mut f);
    J::Obj(f)
}

fn old_istio_entry(rng: &mut Rng) -> J {
    let mut f = vec![
        ("type".to_string(), s("istio-cni")),
        ("name".into(), s("istio-cni")),
        ("log_level".into(), s("info")),
    ];
    if rng.chance(50) {
        f.push((
            "kubernetes".into(),
            J::Obj(vec![
                (
                    "kubeconfig".into(),
                    s("/etc/cni/net.d/ZZZ-istio-cni-kubeconfig"),
                ),
                ("cni_bin_dir".into(), s("/opt/cni/bin")),
            ]),
        ));
    }
    shuffle(rng, &mut f);
    J::Obj(f)
}

fn list(rng: &mut Rng) -> J {
    let mut plugins: Vec<J> = (0..1 + rng.below(3)).map(|_| plugin(rng, false)).collect();
    if rng.chance(30) {
        let at = rng.below(plugins.len() + 1);
        plugins.insert(at, old_istio_entry(rng));
    }
    let mut f = vec![
        (
            "cniVersion".to_string(),
            s(rng.word(&["0.3.1", "0.4.0", "1.0.0"])),
        ),
        (
            "name".into(),
            s(rng.word(&["k8s-pod-network", "dbnet", "cbr0", "ünï"])),
        ),
        ("plugins".into(), J::Arr(plugins)),
    ];
    extras(rng, &mut f, &["cniVersion", "name", "plugins"]);
    shuffle(rng, &mut f);
    J::Obj(f)
}

/// Whitespace and escaping choices for one file.
struct Style {
    indent: &'static str,
    newline: &'static str,
    colon: &'static str,
    escape_non_ascii: bool,
}

fn style(rng: &mut Rng) -> Style {
    let (indent, newline, colon, escape_non_ascii) = *rng.pick(&[
        ("", "", ":", false),
        ("  ", "\n", ": ", false),
        ("\t", "\r\n", " : ", true),
        ("    ", "\n", ":\t", true),
    ]);
    Style {
        indent,
        newline,
        colon,
        escape_non_ascii,
    }
}

fn quote(out: &mut String, text: &str, st: &Style) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if st.escape_non_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04X}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn render(out: &mut String, j: &J, st: &Style, level: usize) {
    let pad = |out: &mut String, n: usize| {
        out.push_str(st.newline);
        for _ in 0..n {
            out.push_str(st.indent);
        }
    };
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(n) => out.push_str(n),
        J::Str(t) => quote(out, t, st),
        J::Arr(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                pad(out, level + 1);
                render(out, v, st, level + 1);
            }
            if !items.is_empty() {
                pad(out, level);
            }
            out.push(']');
        }
        J::Obj(fields) => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                pad(out, level + 1);
                quote(out, k, st);
                out.push_str(st.colon);
                render(out, v, st, level + 1);
            }
            if !fields.is_empty() {
                pad(out, level);
            }
            out.push('}');
        }
    }
}

fn text(rng: &mut Rng, j: &J) -> String {
    let st = style(rng);
    let mut out = String::new();
    if rng.chance(20) {
        out.push_str(" \n");
    }
    render(&mut out, j, &st, 0);
    if rng.chance(60) {
        out.push_str(st.newline);
        out.push('\n');
    }
    out
}

/// An invalid file the loader must skip.
fn invalid(rng: &mut Rng) -> (String, &'static str) {
    match rng.below(5) {
        0 => ("{\"cniVersion\": \"0.3.1\", \"name\": \"x\"".into(), "conf"),
        1 => (
            "{\"cniVersion\": \"0.3.1\", \"name\": \"notype\"}".into(),
            "conf",
        ),
        2 => (
            "{\"cniVersion\": \"0.3.1\", \"plugins\": [{\"type\": \"bridge\"}]}".into(),
            "conflist",
        ),
        3 => (
            "{\"cniVersion\": \"0.3.1\", \"name\": \"empty\", \"plugins\": []}".into(),
            "conflist",
        ),
        _ => (String::new(), "conf"),
    }
}

const PRIORITIES: &[&str] = &["00", "05", "10", "10", "20", "99"];
const NAMES: &[&str] = &["calico", "flannel", "bridge", "a", "zz", "k8s", "cilium"];

pub fn case(rng: &mut Rng) -> Case {
    let mut files: Vec<GenFile> = Vec::new();
    let n = 1 + rng.below(3);
    for _ in 0..n {
        let (text_, ext) = if rng.chance(12) {
            invalid(rng)
        } else if rng.chance(45) {
            let j = plugin(rng, true);
            (text(rng, &j), "conf")
        } else {
            let j = list(rng);
            (text(rng, &j), "conflist")
        };
        let ext = if rng.chance(4) { "json" } else { ext };
        let name = format!("{}-{}.{ext}", *rng.pick(PRIORITIES), *rng.pick(NAMES));
        if files.iter().any(|f| f.name == name) {
            continue;
        }
        let mode = *rng.pick(&[0o644, 0o644, 0o600, 0o640, 0o664]);
        files.push(GenFile {
            name,
            text: text_,
            mode,
        });
    }
    let chained = rng.chance(85);
    let conf_name = if rng.chance(20) {
        let f = rng.pick(&files).name.clone();
        Some(if rng.chance(30) {
            match f.strip_suffix(".conflist") {
                Some(stem) => format!("{stem}.conf"),
                None => f.replace(".conf", ".conflist"),
            }
        } else {
            f
        })
    } else if !chained && rng.chance(20) {
        Some("user-defined.conf".into())
    } else {
        None
    };
    let owned_flag = rng.chance(14);
    // Drawn only for owned chained cases, so the other cases of a seed stay as they were.
    let ambient = owned_flag && chained && rng.chance(75);
    let owned_name = (ambient && rng.chance(40)).then(|| {
        // Sorting before or after the primary: Istio warns of a bypass when after.
        rng.word(&[
            "01-istio-owned.conflist",
            "zz-istio.conflist",
            "02-istio-cni.conflist",
        ])
        .to_string()
    });
    Case {
        files,
        chained,
        conf_name,
        owned_flag,
        ambient,
        owned_name,
        group_read: rng.chance(25),
        exclude: rng.chance(30).then(|| {
            rng.pick(&["kube-system", "istio-system,kube-system", "a,b,c"])
                .to_string()
        }),
    }
}
