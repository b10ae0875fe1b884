//! A small block-YAML reader for the one YAML input the installer takes: the chart's
//! `AMBIENT_ENABLEMENT_SELECTOR` (`toYaml` of a list of label selectors).
//!
//! Supported: block maps and sequences (including `- key: value` compact maps), plain, single- and
//! double-quoted scalars, one-line flow sequences/maps (`[a, b]`, `{}`), comments, a leading `---`.
//! Not supported (rejected with an error): multi-line scalars, anchors, tags. JSON input is handled
//! by the caller with serde_json before falling back here. Every scalar becomes a JSON string, which
//! is what label selectors need.

use serde_json::{Map, Value};

#[derive(Debug, Clone)]
struct Line {
    no: usize,
    indent: usize,
    text: String,
}

/// Parses a YAML document into a JSON value.
pub fn parse(input: &str) -> Result<Value, String> {
    let mut lines = Vec::new();
    for (idx, raw) in input.lines().enumerate() {
        if raw.contains('\t') && raw.trim_start().starts_with('\t') {
            return Err(format!(
                "line {}: tabs are not allowed for indentation",
                idx + 1
            ));
        }
        let stripped = strip_comment(raw);
        let text = stripped.trim_end();
        if text.trim().is_empty() || text.trim() == "---" {
            continue;
        }
        let indent = text.len() - text.trim_start().len();
        lines.push(Line {
            no: idx + 1,
            indent,
            text: text.trim_start().to_string(),
        });
    }
    if lines.is_empty() {
        return Ok(Value::Null);
    }
    let mut i = 0;
    let indent = lines[0].indent;
    let value = parse_node(&mut lines, &mut i, indent)?;
    if let Some(extra) = lines.get(i) {
        return Err(format!(
            "line {}: unexpected content {:?}",
            extra.no, extra.text
        ));
    }
    Ok(value)
}

fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for (pos, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev_space => return &line[..pos],
            None => {}
        }
        prev_space = c == ' ';
    }
    line
}

fn is_seq_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// Finds the `key: value` separator outside quotes and flow brackets.
fn split_key(text: &str) -> Option<(String, &str)> {
    let mut quote: Option<char> = None;
    let bytes = text.as_bytes();
    for (pos, c) in text.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if (c == '"' || c == '\'') && pos == 0 => quote = Some(c),
            None if c == '[' || c == '{' => return None,
            None if c == ':' => {
                let next = bytes.get(pos + 1).copied();
                if next.is_none() || next == Some(b' ') {
                    let key = scalar(text[..pos].trim()).ok()?;
                    return Some((key, text[pos + 1..].trim()));
                }
            }
            None => {}
        }
    }
    None
}

fn parse_node(lines: &mut [Line], i: &mut usize, indent: usize) -> Result<Value, String> {
    let line = lines[*i].clone();
    if line.indent != indent {
        return Err(format!("line {}: unexpected indentation", line.no));
    }
    if is_seq_item(&line.text) {
        parse_seq(lines, i, indent)
    } else if split_key(&line.text).is_some() {
        parse_map(lines, i, indent)
    } else {
        *i += 1;
        if let Some(next) = lines.get(*i)
            && next.indent > indent
        {
            return Err(format!(
                "line {}: multi-line scalars are not supported",
                next.no
            ));
        }
        value_of(&line.text).map_err(|e| format!("line {}: {e}", line.no))
    }
}

fn parse_seq(lines: &mut [Line], i: &mut usize, indent: usize) -> Result<Value, String> {
    let mut items = Vec::new();
    while let Some(line) = lines.get(*i).cloned() {
        if line.indent < indent {
            break;
        }
        if line.indent > indent || !is_seq_item(&line.text) {
            return Err(format!("line {}: expected a list item", line.no));
        }
        let rest = line.text[1..].trim_start();
        if rest.is_empty() {
            *i += 1;
            match lines.get(*i) {
                Some(next) if next.indent > indent => {
                    let child = next.indent;
                    items.push(parse_node(lines, i, child)?);
                }
                _ => items.push(Value::Null),
            }
        } else {
            // Re-read the item's content as if it were a line of its own at its column, so a
            // compact `- key: v` map continues on the following, equally indented lines.
            let offset = line.text.len() - rest.len();
            lines[*i] = Line {
                no: line.no,
                indent: indent + offset,
                text: rest.to_string(),
            };
            items.push(parse_node(lines, i, indent + offset)?);
        }
    }
    Ok(Value::Array(items))
}

fn parse_map(lines: &mut [Line], i: &mut usize, indent: usize) -> Result<Value, String> {
    let mut map = Map::new();
    while let Some(line) = lines.get(*i).cloned() {
        if line.indent < indent {
            break;
        }
        if line.indent > indent {
            return Err(format!("line {}: unexpected indentation", line.no));
        }
        if is_seq_item(&line.text) {
            break;
        }
        let Some((key, rest)) = split_key(&line.text) else {
            return Err(format!("line {}: expected `key: value`", line.no));
        };
        *i += 1;
        let value = if !rest.is_empty() {
            value_of(rest).map_err(|e| format!("line {}: {e}", line.no))?
        } else {
            match lines.get(*i) {
                Some(next) if next.indent > indent => {
                    let child = next.indent;
                    parse_node(lines, i, child)?
                }
                // YAML lets a list under a key sit at the key's own column.
                Some(next) if next.indent == indent && is_seq_item(&next.text) => {
                    parse_seq(lines, i, indent)?
                }
                _ => Value::Null,
            }
        };
        if map.insert(key.clone(), value).is_some() {
            return Err(format!("line {}: duplicate key {key:?}", line.no));
        }
    }
    Ok(Value::Object(map))
}

fn value_of(text: &str) -> Result<Value, String> {
    let text = text.trim();
    if text.starts_with('[') || text.starts_with('{') {
        return flow(text);
    }
    if text.starts_with('&') || text.starts_with('*') || text.starts_with('!') {
        return Err(format!(
            "anchors, aliases and tags are not supported: {text:?}"
        ));
    }
    if text == "|" || text == ">" || text.starts_with("|-") || text.starts_with(">-") {
        return Err("multi-line scalars are not supported".to_string());
    }
    if text == "~" || text == "null" || text == "Null" || text == "NULL" {
        return Ok(Value::Null);
    }
    scalar(text).map(Value::String)
}

fn scalar(text: &str) -> Result<String, String> {
    if let Some(inner) = text.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or_else(|| format!("unterminated quoted string {text:?}"))?;
        return Ok(inner.replace("''", "'"));
    }
    if text.starts_with('"') {
        return serde_json::from_str::<String>(text)
            .map_err(|e| format!("bad double-quoted string {text:?}: {e}"));
    }
    Ok(text.to_string())
}

fn flow(text: &str) -> Result<Value, String> {
    let (open, close) = if text.starts_with('[') {
        ('[', ']')
    } else {
        ('{', '}')
    };
    let inner = text
        .strip_prefix(open)
        .and_then(|t| t.strip_suffix(close))
        .ok_or_else(|| format!("unterminated flow collection {text:?}"))?;
    let mut parts = Vec::new();
    let mut quote: Option<char> = None;
    let mut start = 0;
    for (pos, c) in inner.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '[' || c == '{' => {
                return Err(format!(
                    "nested flow collections are not supported: {text:?}"
                ));
            }
            None if c == ',' => {
                parts.push(inner[start..pos].trim());
                start = pos + 1;
            }
            None => {}
        }
    }
    let last = inner[start..].trim();
    if !last.is_empty() || !parts.is_empty() {
        parts.push(last);
    }
    if open == '[' {
        let items = parts
            .into_iter()
            .map(value_of)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Value::Array(items))
    } else {
        let mut map = Map::new();
        for part in parts {
            let (k, v) =
                split_key(part).ok_or_else(|| format!("expected `key: value` in {text:?}"))?;
            map.insert(k, value_of(v)?);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chart_default_selectors() {
        let text = "\
- podSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
- podSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
  namespaceSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
";
        let v = parse(text).expect("parses");
        assert_eq!(
            v,
            json!([
                {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
                {"podSelector": {"matchExpressions": [
                    {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
                 "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
            ])
        );
    }

    #[test]
    fn flow_quotes_and_comments() {
        let v =
            parse("# c\n---\na: 'x''y' # trailing\nb: [\"1\", two]\nc: {}\nd:\n").expect("parses");
        assert_eq!(
            v,
            json!({"a": "x'y", "b": ["1", "two"], "c": {}, "d": null})
        );
    }

    #[test]
    fn bad_indentation_is_an_error() {
        assert!(parse("a: b\n   c: d\n").is_err());
        assert!(parse("- a\nb: c\n").is_err());
        assert!(parse("a: |\n  text\n").is_err());
    }
}
