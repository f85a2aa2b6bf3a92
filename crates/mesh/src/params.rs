//! The request parameters Triton gives a meaning to (`sequence_id` and its flags, `timeout`, `priority`),
//! each read here with one rule, by every frontend, the router, the node, ensembles and BLS alike;
//! [`Controls::parse`] reads them all at once, when a request is admitted, into the one typed value
//! the node then passes along instead of reading the parameters again.
//!
//! The rules are the strict ones Triton's server applies: `sequence_id` is a positive integer or a string
//! (0 and "" mean none; a negative number or another type is refused), the sequence flags are booleans,
//! `timeout` is a non-negative integer of microseconds (0: none) and `priority` a small non-negative integer.
use std::time::Duration;

use crate::error::{Error, Result};
use crate::request::{Param, Params};

/// A sequence's correlation id as the client sent it (`sequence_id`: an integer or a string).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SequenceId {
    Int(u64),
    Str(String),
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceId::Int(i) => write!(f, "{i}"),
            SequenceId::Str(s) => write!(f, "'{s}'"),
        }
    }
}

fn find<'a>(params: &'a Params, name: &str) -> Option<&'a Param> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// `sequence_id`: `None` when absent, 0 or empty.
pub fn sequence_id(params: &Params) -> Result<Option<SequenceId>> {
    match find(params, "sequence_id") {
        None | Some(Param::Int(0) | Param::Uint(0)) => Ok(None),
        Some(Param::Int(i)) if *i > 0 => Ok(Some(SequenceId::Int(*i as u64))),
        Some(Param::Uint(u)) => Ok(Some(SequenceId::Int(*u))),
        Some(Param::String(s)) if s.is_empty() => Ok(None),
        Some(Param::String(s)) => Ok(Some(SequenceId::Str(s.clone()))),
        Some(other) => Err(Error::invalid(format!(
            "parameter 'sequence_id' must be a positive integer or a string, got {other:?}"
        ))),
    }
}

/// `sequence_start` and `sequence_end` (false when absent).
pub fn sequence_flags(params: &Params) -> Result<(bool, bool)> {
    let flag = |name: &str| match find(params, name) {
        None => Ok(false),
        Some(Param::Bool(b)) => Ok(*b),
        Some(other) => Err(Error::invalid(format!(
            "parameter '{name}' must be a boolean, got {other:?}"
        ))),
    };
    Ok((flag("sequence_start")?, flag("sequence_end")?))
}

/// `timeout` in microseconds: `None` when absent or 0.
pub fn timeout(params: &Params) -> Result<Option<Duration>> {
    match find(params, "timeout") {
        None => Ok(None),
        Some(v) => {
            let us = v.as_u64().ok_or_else(|| {
                Error::invalid(format!(
                    "parameter 'timeout' must be a non-negative integer (µs), got {v:?}"
                ))
            })?;
            Ok((us > 0).then(|| Duration::from_micros(us)))
        }
    }
}

/// `priority` (0, the default, when absent).
pub fn priority(params: &Params) -> Result<u32> {
    match find(params, "priority") {
        None => Ok(0),
        Some(v) => v.as_u64().and_then(|p| u32::try_from(p).ok()).ok_or_else(|| {
            Error::invalid(format!(
                "parameter 'priority' must be a small non-negative integer, got {v:?}"
            ))
        }),
    }
}

/// A request's sequence controls: its correlation id (`sequence_id`; None when absent, 0 or empty)
/// and its START and END flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SequenceControls {
    pub id: Option<SequenceId>,
    pub start: bool,
    pub end: bool,
}

/// What a request's parameters ask of its scheduling, read once by [`Controls::parse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controls {
    /// `priority` (0: the default).
    pub priority: u32,
    /// `timeout` (None: absent or 0).
    pub timeout: Option<Duration>,
    pub sequence: SequenceControls,
}

impl Controls {
    /// Reads every parameter Triton gives a meaning to, each by its one rule, in a fixed order
    /// (`sequence_id`, the sequence flags, `timeout`, `priority`): the first broken rule is the error.
    pub fn parse(params: &Params) -> Result<Controls> {
        let id = sequence_id(params)?;
        let (start, end) = sequence_flags(params)?;
        Ok(Controls {
            timeout: timeout(params)?,
            priority: priority(params)?,
            sequence: SequenceControls { id, start, end },
        })
    }
}

/// Every rule at once: what a router checks before it routes, so it refuses what a node would.
pub fn check(params: &Params) -> Result<()> {
    Controls::parse(params).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, v: Param) -> Params {
        vec![(name.into(), v)]
    }

    #[test]
    fn sequence_ids_follow_one_rule() {
        let id = |v| sequence_id(&with("sequence_id", v));
        assert_eq!(id(Param::Uint(42)), Ok(Some(SequenceId::Int(42))));
        assert_eq!(id(Param::Int(7)), Ok(Some(SequenceId::Int(7))));
        assert_eq!(id(Param::String("s1".into())), Ok(Some(SequenceId::Str("s1".into()))));
        assert_eq!(id(Param::Uint(0)), Ok(None));
        assert_eq!(id(Param::Int(0)), Ok(None));
        assert_eq!(id(Param::String(String::new())), Ok(None));
        assert_eq!(sequence_id(&Vec::new()), Ok(None));
        let e = id(Param::Int(-3)).expect_err("negative");
        assert!(
            e.message
                .contains("'sequence_id' must be a positive integer or a string"),
            "{}",
            e.message
        );
        assert!(id(Param::Bool(true)).is_err() && id(Param::Double(1.5)).is_err());
        assert_eq!(SequenceId::Str("a".into()).to_string(), "'a'");
        assert_eq!(SequenceId::Int(1).to_string(), "1");
    }

    #[test]
    fn flags_timeout_and_priority_are_strict() {
        assert_eq!(
            sequence_flags(&with("sequence_start", Param::Bool(true))),
            Ok((true, false))
        );
        assert!(sequence_flags(&with("sequence_end", Param::Int(1))).is_err());
        assert_eq!(
            timeout(&with("timeout", Param::Uint(1500))),
            Ok(Some(Duration::from_micros(1500)))
        );
        assert_eq!(timeout(&with("timeout", Param::Int(0))), Ok(None));
        assert!(timeout(&with("timeout", Param::Int(-1))).is_err());
        assert!(timeout(&with("timeout", Param::String("5".into()))).is_err());
        assert_eq!(priority(&with("priority", Param::Uint(2))), Ok(2));
        assert!(priority(&with("priority", Param::Uint(1 << 40))).is_err());
        assert!(check(&with("timeout", Param::Double(1.0))).is_err());
        assert!(check(&vec![("other".into(), Param::Double(1.0))]).is_ok());
    }

    #[test]
    fn controls_are_parsed_once_into_one_value() {
        let params: Params = vec![
            ("sequence_id".into(), Param::String("s7".into())),
            ("sequence_start".into(), Param::Bool(true)),
            ("timeout".into(), Param::Uint(2500)),
            ("priority".into(), Param::Int(3)),
            ("custom".into(), Param::Double(0.5)),
        ];
        assert_eq!(
            Controls::parse(&params),
            Ok(Controls {
                priority: 3,
                timeout: Some(Duration::from_micros(2500)),
                sequence: SequenceControls {
                    id: Some(SequenceId::Str("s7".into())),
                    start: true,
                    end: false,
                },
            })
        );
        assert_eq!(Controls::parse(&Vec::new()), Ok(Controls::default()));
        let ended = Controls::parse(&with("sequence_end", Param::Bool(true))).unwrap();
        assert_eq!(
            ended.sequence,
            SequenceControls {
                id: None,
                start: false,
                end: true
            }
        );
        assert_eq!(
            Controls::parse(&with("sequence_id", Param::Uint(0)))
                .unwrap()
                .sequence
                .id,
            None
        );
    }

    #[test]
    fn each_broken_rule_is_named_as_before() {
        let refused = |params: Params| {
            let e = Controls::parse(&params).expect_err("refused");
            assert_eq!(e.code, crate::Code::InvalidArgument);
            assert_eq!(check(&params), Err(e.clone()), "check refuses as parse does");
            e.message
        };
        let cases: Vec<(Params, &str)> = vec![
            (
                with("sequence_id", Param::Double(1.0)),
                "parameter 'sequence_id' must be a positive integer or a string, got Double(1.0)",
            ),
            (
                with("sequence_start", Param::Int(1)),
                "parameter 'sequence_start' must be a boolean, got Int(1)",
            ),
            (
                with("sequence_end", Param::String("yes".into())),
                "parameter 'sequence_end' must be a boolean, got String(\"yes\")",
            ),
            (
                with("timeout", Param::Int(-1)),
                "parameter 'timeout' must be a non-negative integer (µs), got Int(-1)",
            ),
            (
                with("priority", Param::Uint(1 << 40)),
                "parameter 'priority' must be a small non-negative integer, got Uint(1099511627776)",
            ),
        ];
        for (params, want) in cases {
            assert_eq!(refused(params), want);
        }
        // Several broken: the first in the fixed order is the one named.
        let all: Params = vec![
            ("priority".into(), Param::Bool(true)),
            ("timeout".into(), Param::Bool(true)),
            ("sequence_end".into(), Param::Int(2)),
            ("sequence_id".into(), Param::Int(-1)),
        ];
        assert!(refused(all.clone()).contains("'sequence_id'"));
        assert!(refused(all[..3].to_vec()).contains("'sequence_end'"));
        assert!(refused(all[..2].to_vec()).contains("'timeout'"));
        assert!(refused(all[..1].to_vec()).contains("'priority'"));
    }
}
