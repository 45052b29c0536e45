//! JSON text in json-c's `JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE` layout,
//! which `cryptsetup luksDump --dump-json-metadata` prints: two-space indentation, no space
//! after `:`, one member or element per line, an empty object or array as `{` / `[`, a
//! newline and the closing bracket at the parent's indentation. Strings escape `"`, `\`,
//! `\b`, `\f`, `\n`, `\r`, `\t` and other control bytes as `\u00XX`; everything else,
//! `/` and non-ASCII included, is written as is. No newline after the last bracket.

use std::fmt::Write as _;

use serde_json::Value;

/// `v` in json-c's pretty layout.
pub fn json_c_pretty(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v, 0);
    out
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_value(out: &mut String, v: &Value, level: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                write_value(out, item, level + 1);
            }
            if !items.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push(']');
        }
        Value::Object(members) => {
            out.push_str("{\n");
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                write_string(out, k);
                out.push(':');
                write_value(out, item, level + 1);
            }
            if !members.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_json_c() {
        let v: Value = serde_json::from_str(r#"{"a":{},"b":["0","1"],"c":{"d":1,"e":[]},"f":"x/\"y\n"}"#)
            .expect("valid JSON");
        assert_eq!(
            json_c_pretty(&v),
            "{\n  \"a\":{\n  },\n  \"b\":[\n    \"0\",\n    \"1\"\n  ],\n  \"c\":{\n    \"d\":1,\n    \"e\":[\n    ]\n  },\n  \"f\":\"x/\\\"y\\n\"\n}"
        );
    }
}
