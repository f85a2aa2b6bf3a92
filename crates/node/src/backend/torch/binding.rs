//! Which config input fills which forward() argument, and which returned value is which output.
//!
//! Sans-IO: the rules work on names, types and the shape of the returned value, so they are tested
//! without libtorch.
use mesh::DataType;

use super::signature::{Arg, ArgType};

/// A config input (or output) as the backend sees it.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DataType,
    pub dims: Vec<i64>,
}

/// One positional argument of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub arg: String,
    pub ty: ArgType,
    pub has_default: bool,
    /// The config input (index) that fills it; None leaves it to its default.
    pub input: Option<usize>,
}

/// How the config inputs reach forward().
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// `forward(self, inputs: Dict[str, Tensor])`: each config input is one key.
    Dict,
    Positional(Vec<Slot>),
}

/// The index in Triton's `<name>__<index>` naming convention.
pub fn convention_index(name: &str) -> Option<usize> {
    let (stem, index) = name.rsplit_once("__")?;
    if stem.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    index.parse().ok()
}

/// Binds config inputs to forward()'s arguments: by argument name, else by Triton's
/// `<name>__<index>` convention, else (signature unknown) in config order.
pub fn bind_inputs(inputs: &[TensorSpec], signature: Option<&[Arg]>, batched: bool) -> Result<Binding, String> {
    if let Some([only]) = signature {
        if only.ty == ArgType::TensorDict {
            if let Some(bytes) = inputs.iter().find(|i| i.dtype == DataType::Bytes) {
                return Err(format!(
                    "input '{}' is BYTES, but forward() takes Dict[str, Tensor]",
                    bytes.name
                ));
            }
            return Ok(Binding::Dict);
        }
    }
    let by_name = signature.filter(|args| inputs.iter().all(|i| args.iter().any(|a| a.name == i.name)));
    let indices: Option<Vec<usize>> = inputs.iter().map(|i| convention_index(&i.name)).collect();
    let mut slots: Vec<Slot> = match (signature, by_name, indices) {
        (_, Some(args), _) => args
            .iter()
            .map(|a| slot(a, inputs.iter().position(|i| i.name == a.name)))
            .collect(),
        (sig, None, Some(indices)) => {
            // Without a signature the indices must number the inputs themselves (0..n), so nothing
            // is sized by a number taken from a name.
            let count = sig.map_or(inputs.len(), <[Arg]>::len);
            let mut slots: Vec<Slot> = match sig {
                Some(args) => args.iter().map(|a| slot(a, None)).collect(),
                None => (0..count)
                    .map(|i| unnamed_slot(format!("argument {i}"), None))
                    .collect(),
            };
            for (input, &index) in indices.iter().enumerate() {
                let Some(s) = slots.get_mut(index) else {
                    return Err(format!(
                        "input '{}' names argument {index}, but forward() takes {count} argument(s)",
                        inputs[input].name
                    ));
                };
                if let Some(other) = s.input {
                    return Err(format!(
                        "inputs '{}' and '{}' both name argument {index}",
                        inputs[other].name, inputs[input].name
                    ));
                }
                s.input = Some(input);
            }
            slots
        }
        (Some(args), None, None) => {
            let names: Vec<_> = args.iter().map(|a| a.name.as_str()).collect();
            let stray = inputs
                .iter()
                .find(|i| !names.contains(&i.name.as_str()))
                .map_or("", |i| &i.name);
            return Err(format!(
                "input '{stray}' is neither a forward() argument {names:?} nor named by Triton's \
                 <name>__<index> convention"
            ));
        }
        (None, None, None) => (0..inputs.len())
            .map(|i| unnamed_slot(inputs[i].name.clone(), Some(i)))
            .collect(),
    };
    for s in &slots {
        check_slot(s, inputs, batched)?;
    }
    // Arguments after the last given one fall back to their defaults, so the call stops there.
    while slots.last().is_some_and(|s| s.input.is_none() && s.has_default) {
        slots.pop();
    }
    // A positional call cannot skip one: a defaulted argument before a given one needs a value.
    if let Some(skipped) = slots
        .iter()
        .find(|s| s.input.is_none() && s.ty != ArgType::OptionalTensor)
    {
        return Err(format!(
            "forward() argument '{}' has a default, but a later argument is given, so the call must pass it; \
             list it in config.pbtxt",
            skipped.arg
        ));
    }
    Ok(Binding::Positional(slots))
}

fn slot(arg: &Arg, input: Option<usize>) -> Slot {
    Slot {
        arg: arg.name.clone(),
        ty: arg.ty.clone(),
        has_default: arg.has_default,
        input,
    }
}

fn unnamed_slot(arg: String, input: Option<usize>) -> Slot {
    Slot {
        arg,
        ty: ArgType::Tensor,
        has_default: false,
        input,
    }
}

/// Checks that the input bound to `s` can become its argument's type.
fn check_slot(s: &Slot, inputs: &[TensorSpec], batched: bool) -> Result<(), String> {
    let Some(i) = s.input else {
        if s.has_default || s.ty == ArgType::OptionalTensor {
            return Ok(());
        }
        return Err(format!(
            "forward() needs argument '{}', which config.pbtxt does not list (by that name or as <name>__<index>)",
            s.arg
        ));
    };
    let input = &inputs[i];
    let d = input.dtype;
    let integer = matches!(
        d,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Uint8
    );
    let float = matches!(d, DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16);
    let fits = match &s.ty {
        ArgType::Tensor | ArgType::OptionalTensor => d != DataType::Bytes,
        ArgType::Int => integer,
        ArgType::Float => float || integer,
        ArgType::Bool => d == DataType::Bool,
        ArgType::Str | ArgType::StrList => d == DataType::Bytes,
        ArgType::TensorDict => false,
        ArgType::Other(ty) => {
            return Err(format!(
                "forward() argument '{}' has type {ty}, which cannot be passed from a tensor",
                s.arg
            ))
        }
    };
    if !fits {
        return Err(format!(
            "input '{}' is {} but forward() argument '{}' is {:?}",
            input.name,
            d.wire_name(),
            s.arg,
            s.ty
        ));
    }
    if s.ty.is_scalar() {
        if batched {
            return Err(format!(
                "forward() argument '{}' takes one value, so the model cannot batch; set max_batch_size: 0",
                s.arg
            ));
        }
        if input.dims.iter().any(|&d| d != 1) {
            return Err(format!(
                "input '{}' feeds forward() argument '{}', which takes one value, so its dims must be [1]",
                input.name, s.arg
            ));
        }
    }
    Ok(())
}

/// The shape of what forward() returned; leaves index the tensors (or string lists) it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Produced {
    Leaf(usize),
    Seq(Vec<Produced>),
    Map(Vec<(String, Produced)>),
}

struct FoundLeaf {
    leaf: usize,
    /// The dict keys on the way to the leaf, outermost first.
    keys: Vec<String>,
}

fn flatten(p: &Produced, keys: &mut Vec<String>, out: &mut Vec<FoundLeaf>) {
    match p {
        Produced::Leaf(leaf) => out.push(FoundLeaf {
            leaf: *leaf,
            keys: keys.clone(),
        }),
        Produced::Seq(items) => items.iter().for_each(|i| flatten(i, keys, out)),
        Produced::Map(entries) => {
            for (k, v) in entries {
                keys.push(k.clone());
                flatten(v, keys, out);
                keys.pop();
            }
        }
    }
}

/// Picks, for each wanted output name, the leaf that produces it. Dict values match by key (the
/// full dotted path of nested dicts, or the last key when that is unique); the other values match
/// in order, or by `<name>__<index>` among them, as Triton maps tuples. `all` is every config
/// output name, in config order, which positional matching counts against.
pub fn assign_outputs(produced: &Produced, wanted: &[&str], all: &[&str]) -> Result<Vec<usize>, String> {
    let mut leaves = Vec::new();
    flatten(produced, &mut Vec::new(), &mut leaves);
    let (keyed, plain): (Vec<&FoundLeaf>, Vec<&FoundLeaf>) = leaves.iter().partition(|l| !l.keys.is_empty());
    let by_key = |name: &str| -> Result<Option<usize>, String> {
        let full: Vec<_> = keyed.iter().filter(|l| l.keys.join(".") == name).collect();
        let last: Vec<_> = keyed
            .iter()
            .filter(|l| l.keys.last().is_some_and(|k| k == name))
            .collect();
        let hits = if full.is_empty() { last } else { full };
        match hits.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.leaf)),
            many => Err(format!(
                "output '{name}' is ambiguous: the model returned it at {:?}",
                many.iter().map(|l| l.keys.join(".")).collect::<Vec<_>>()
            )),
        }
    };
    // Config outputs not found among dict keys take the other values, in config order.
    let mut unkeyed = Vec::new();
    for &name in all {
        if by_key(name)?.is_none() {
            unkeyed.push(name);
        }
    }
    let use_indices = !unkeyed.is_empty() && unkeyed.iter().all(|n| convention_index(n).is_some());
    let mut picked = Vec::with_capacity(wanted.len());
    for &name in wanted {
        if let Some(leaf) = by_key(name)? {
            picked.push(leaf);
            continue;
        }
        let position = if use_indices {
            convention_index(name)
        } else {
            unkeyed.iter().position(|n| *n == name)
        };
        match position.and_then(|p| plain.get(p)) {
            Some(l) => picked.push(l.leaf),
            None => {
                let keys: Vec<_> = keyed.iter().map(|l| l.keys.join(".")).collect();
                return Err(format!(
                    "output '{name}' is not produced: the model returned {} unnamed value(s) and the keys {keys:?}",
                    plain.len()
                ));
            }
        }
    }
    Ok(picked)
}

#[cfg(test)]
#[path = "binding_tests.rs"]
mod tests;
