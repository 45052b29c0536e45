//! Helpers shared by the JSON section codecs (cryptsetup's `luks2_internal.h` counterpart):
//! typed field extraction with one error per malformation, 64-bit values as decimal
//! strings, base64, and object ids. Not part of the public API.
//!
//! Extraction *removes* known fields from the object's map, so what is left over is exactly
//! the set of unknown fields, kept in each struct's `extra` and written back on encode.

use base64::Engine as _;
use serde_json::{Map, Value};

use super::json::MetadataError;

pub(crate) type Obj = Map<String, Value>;

pub(crate) const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// JSON type name as json-c prints it in cryptsetup's debug messages.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "double",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(crate) fn wrong_type(
    what: &str,
    field: &'static str,
    expected: &'static str,
    v: &Value,
) -> MetadataError {
    MetadataError::WrongType { what: what.to_owned(), field, expected, found: type_name(v) }
}

pub(crate) fn take(o: &mut Obj, what: &str, field: &'static str) -> Result<Value, MetadataError> {
    o.shift_remove(field).ok_or_else(|| MetadataError::MissingField { what: what.to_owned(), field })
}

/// A non-empty string (cryptsetup `json_contains_string`).
pub(crate) fn take_str(o: &mut Obj, what: &str, field: &'static str) -> Result<String, MetadataError> {
    match take(o, what, field)? {
        Value::String(s) if s.is_empty() => Err(MetadataError::EmptyString { what: what.to_owned(), field }),
        Value::String(s) => Ok(s),
        v => Err(wrong_type(what, field, "string", &v)),
    }
}

/// A 64-bit unsigned value stored as a decimal string (cryptsetup `numbered` +
/// `json_str_to_uint64`).
pub(crate) fn parse_u64_str(s: &str, what: &str, field: &'static str) -> Result<u64, MetadataError> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(MetadataError::NotDecimal { what: what.to_owned(), field, value: s.to_owned() });
    }
    s.parse::<u64>().map_err(|_| MetadataError::Uint64Overflow {
        what: what.to_owned(),
        field,
        value: s.to_owned(),
    })
}

pub(crate) fn take_u64_str(o: &mut Obj, what: &str, field: &'static str) -> Result<u64, MetadataError> {
    let s = take_str(o, what, field)?;
    parse_u64_str(&s, what, field)
}

/// A JSON integer in `0..=u32::MAX` (cryptsetup `json_contains(.., json_type_int)` +
/// `validate_json_uint32`).
pub(crate) fn take_u32(o: &mut Obj, what: &str, field: &'static str) -> Result<u32, MetadataError> {
    let v = take(o, what, field)?;
    let Value::Number(n) = &v else {
        return Err(wrong_type(what, field, "int", &v));
    };
    if n.is_f64() {
        return Err(wrong_type(what, field, "int", &v));
    }
    n.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| MetadataError::OutOfRange {
        what: what.to_owned(),
        field,
        value: n.to_string(),
    })
}

/// A JSON integer that fits an i32 (cryptsetup reads these with `json_object_get_int`).
pub(crate) fn take_i32(o: &mut Obj, what: &str, field: &'static str) -> Result<i32, MetadataError> {
    let v = take(o, what, field)?;
    let Value::Number(n) = &v else {
        return Err(wrong_type(what, field, "int", &v));
    };
    if n.is_f64() {
        return Err(wrong_type(what, field, "int", &v));
    }
    n.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(|| MetadataError::OutOfRange {
        what: what.to_owned(),
        field,
        value: n.to_string(),
    })
}

pub(crate) fn take_obj(o: &mut Obj, what: &str, field: &'static str) -> Result<Obj, MetadataError> {
    match take(o, what, field)? {
        Value::Object(m) => Ok(m),
        v => Err(wrong_type(what, field, "object", &v)),
    }
}

/// An array whose members are all strings.
pub(crate) fn take_str_array(
    o: &mut Obj,
    what: &str,
    field: &'static str,
) -> Result<Vec<String>, MetadataError> {
    let v = take(o, what, field)?;
    let Value::Array(items) = v else {
        return Err(wrong_type(what, field, "array", &v));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::String(s) => Ok(s),
            other => Err(MetadataError::WrongElementType {
                what: what.to_owned(),
                field,
                index,
                found: type_name(&other),
            }),
        })
        .collect()
}

pub(crate) fn take_opt_str_array(
    o: &mut Obj,
    what: &str,
    field: &'static str,
) -> Result<Option<Vec<String>>, MetadataError> {
    if o.contains_key(field) {
        take_str_array(o, what, field).map(Some)
    } else {
        Ok(None)
    }
}

pub(crate) fn take_base64(o: &mut Obj, what: &str, field: &'static str) -> Result<Vec<u8>, MetadataError> {
    let s = take_str(o, what, field)?;
    B64.decode(s.as_bytes()).map_err(|_| MetadataError::BadBase64 { what: what.to_owned(), field })
}

/// An object id: a decimal string (cryptsetup `numbered`), here also required to fit u32.
pub(crate) fn parse_id(section: &'static str, key: &str) -> Result<u32, MetadataError> {
    if key.is_empty() || !key.bytes().all(|c| c.is_ascii_digit()) {
        return Err(MetadataError::BadId { section, id: key.to_owned() });
    }
    key.parse().map_err(|_| MetadataError::BadId { section, id: key.to_owned() })
}

/// `"123"`.
pub(crate) fn u64_str(v: u64) -> Value {
    Value::String(v.to_string())
}

pub(crate) fn str_array(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

pub(crate) fn id_array(ids: &[u32]) -> Value {
    Value::Array(ids.iter().map(|i| Value::String(i.to_string())).collect())
}

pub(crate) fn b64(bytes: &[u8]) -> Value {
    Value::String(B64.encode(bytes))
}

/// Append unknown fields after the known ones, in their original order.
pub(crate) fn append_extra(o: &mut Obj, extra: &Obj) {
    for (k, v) in extra {
        if !o.contains_key(k) {
            o.insert(k.clone(), v.clone());
        }
    }
}
