//! JSON bodies read without letting a small body expand into a huge tree: a general value is built
//! with a bound on its nodes, and request parameters are read as a bounded map of scalars that
//! refuses an array or object as soon as it starts, before any of it is built.
use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Result};
use crate::request::{Param, Params};

/// Values (numbers, strings, array and object entries...) one JSON body may hold when it is read
/// as a general value (generate, shared memory, trace, logging, repository bodies). A tensor's
/// data does not count: infer bodies read it straight into bytes.
pub const MAX_JSON_VALUES: usize = 1 << 20;

/// Parameters one request, input or output may carry.
pub const MAX_PARAMETERS: usize = 256;

/// Parses `body` as JSON into a value of at most [`MAX_JSON_VALUES`] values; `what` names the body
/// in errors.
pub fn parse(body: &[u8], what: &str) -> Result<Value> {
    parse_with(body, MAX_JSON_VALUES, what)
}

pub(crate) fn parse_with(body: &[u8], limit: usize, what: &str) -> Result<Value> {
    value_with(body, limit).map_err(|e| Error::invalid(format!("failed to parse the {what}: {e}")))
}

/// Parses `body` as JSON into a value of at most [`MAX_JSON_VALUES`] values, with serde_json's
/// error for callers that word their own message.
pub fn value(body: &[u8]) -> serde_json::Result<Value> {
    value_with(body, MAX_JSON_VALUES)
}

fn value_with(body: &[u8], limit: usize) -> serde_json::Result<Value> {
    let left = Cell::new(limit);
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = Bounded { left: &left, limit }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Parses `body` as a JSON object into its entries in document order, a key given twice kept
/// twice, within [`MAX_JSON_VALUES`] values; `None` when the body is JSON but not an object.
pub fn object_entries(body: &[u8], what: &str) -> Result<Option<Vec<(String, Value)>>> {
    let left = Cell::new(MAX_JSON_VALUES);
    let bounded = Bounded {
        left: &left,
        limit: MAX_JSON_VALUES,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = |de: &mut serde_json::Deserializer<_>| -> serde_json::Result<EntriesOf> {
        let entries = Entries(bounded).deserialize(&mut *de)?;
        de.end()?;
        Ok(entries)
    };
    read(&mut de).map_err(|e| Error::invalid(format!("failed to parse the {what}: {e}")))
}

/// A top-level object's entries, each value bounded; any other JSON value is read (bounded) and
/// answered as `None`.
struct Entries<'a>(Bounded<'a>);

type EntriesOf = Option<Vec<(String, Value)>>;

impl<'de> DeserializeSeed<'de> for Entries<'_> {
    type Value = EntriesOf;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<EntriesOf, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = EntriesOf;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<EntriesOf, A::Error> {
        self.0.take()?;
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            out.push((key, map.next_value_seed(self.0)?));
        }
        Ok(Some(out))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<EntriesOf, A::Error> {
        self.0.visit_seq(seq).map(|_| None)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<EntriesOf, E> {
        self.0.visit_bool(v).map(|_| None)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<EntriesOf, E> {
        self.0.visit_i64(v).map(|_| None)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<EntriesOf, E> {
        self.0.visit_u64(v).map(|_| None)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<EntriesOf, E> {
        self.0.visit_f64(v).map(|_| None)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<EntriesOf, E> {
        self.0.visit_str(v).map(|_| None)
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<EntriesOf, E> {
        self.0.visit_unit().map(|_| None)
    }
}

#[derive(Clone, Copy)]
struct Bounded<'a> {
    left: &'a Cell<usize>,
    limit: usize,
}

impl Bounded<'_> {
    fn take<E: de::Error>(&self) -> std::result::Result<(), E> {
        match self.left.get() {
            0 => Err(E::custom(format!(
                "the body holds more than {} JSON values",
                self.limit
            ))),
            n => {
                self.left.set(n - 1);
                Ok(())
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Value, E> {
        self.take()?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<Value, E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        self.take()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        self.take()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A `parameters` object of an infer body: at most [`MAX_PARAMETERS`] entries, each a bool,
/// number or string. Anything else is refused where it starts, naming the parameter.
#[derive(Debug, Default, PartialEq)]
pub struct ScalarParams(pub Params);

impl<'de> de::Deserialize<'de> for ScalarParams {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(ParamsVisitor)
    }
}

struct ParamsVisitor;

impl<'de> Visitor<'de> for ParamsVisitor {
    type Value = ScalarParams;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of parameters")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<ScalarParams, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.len() == MAX_PARAMETERS {
                return Err(de::Error::custom(format!("more than {MAX_PARAMETERS} parameters")));
            }
            let value = map.next_value_seed(ScalarSeed(&key))?;
            // A repeated name keeps its last value, as an object read into a map does.
            out.retain(|(k, _): &(String, Param)| *k != key);
            out.push((key, value));
        }
        Ok(ScalarParams(out))
    }
}

struct ScalarSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for ScalarSeed<'_> {
    type Value = Param;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Param, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed<'_> {
    type Value = Param;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "parameter '{}' to be a bool, number or string", self.0)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Param, E> {
        Ok(Param::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Param, E> {
        Ok(Param::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Param, E> {
        Ok(i64::try_from(v).map_or(Param::Uint(v), Param::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Param, E> {
        Ok(Param::Double(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Param, E> {
        Ok(Param::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Param, E> {
        Ok(Param::String(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_entries_keep_order_and_duplicates_and_their_bound() {
        let e = object_entries(br#"{"b": 1, "a": [2], "b": "x"}"#, "body")
            .unwrap()
            .unwrap();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
        assert_eq!(e[2].1, Value::String("x".into()));
        assert_eq!(object_entries(b"[1, 2]", "body").unwrap(), None);
        assert_eq!(object_entries(b"7", "body").unwrap(), None);
        let e = object_entries(b"{\"a\": 1} x", "body").unwrap_err();
        assert!(e.message.starts_with("failed to parse the body"), "{e}");
        let huge = format!("{{\"a\": [{}0]}}", "0,".repeat(MAX_JSON_VALUES));
        let e = object_entries(huge.as_bytes(), "body").unwrap_err();
        assert!(e.message.contains("more than"), "{e}");
    }

    #[test]
    fn a_value_past_its_bound_is_refused_before_it_is_built() {
        let body = format!("[{}0]", "0,".repeat(999));
        assert_eq!(
            parse_with(body.as_bytes(), 1001, "body")
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            1000
        );
        let e = parse_with(body.as_bytes(), 1000, "body").unwrap_err();
        assert!(e.message.contains("more than 1000 JSON values"), "{}", e.message);
        let nested = br#"{"a": {"b": [1, "x", null, true, 2.5]}}"#;
        assert_eq!(parse(nested, "body").unwrap()["a"]["b"][1], "x");
        assert!(parse(b"[1] [2]", "body").is_err(), "trailing data");
    }

    #[test]
    fn parameters_are_scalars_and_bounded() {
        let p: ScalarParams =
            serde_json::from_str(r#"{"a": 1, "b": true, "c": "s", "d": 2.5, "e": 18446744073709551615, "a": 2}"#)
                .unwrap();
        assert_eq!(
            p.0,
            vec![
                ("b".to_string(), Param::Bool(true)),
                ("c".to_string(), Param::String("s".into())),
                ("d".to_string(), Param::Double(2.5)),
                ("e".to_string(), Param::Uint(u64::MAX)),
                ("a".to_string(), Param::Int(2)),
            ]
        );
        let e = serde_json::from_str::<ScalarParams>(r#"{"x": [0, 0, 0]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameter 'x' to be a bool, number or string"), "{e}");
        let many = format!(
            "{{{}}}",
            (0..=MAX_PARAMETERS)
                .map(|i| format!("\"k{i}\": 0"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let e = serde_json::from_str::<ScalarParams>(&many).unwrap_err().to_string();
        assert!(e.contains("more than 256 parameters"), "{e}");
    }
}
