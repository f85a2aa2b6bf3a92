//! Reads forward()'s signature from a TorchScript archive's code, so inputs bind by name and type.
//!
//! TorchScript keeps each class's compiled code as Python source under `code/` in the archive
//! (`def forward(self: __torch__.M, x: Tensor, sr: int) -> Dict[str, Tensor]:`); tch exposes no
//! schema, so this is where argument names and types come from.

/// What forward() takes in one argument (after `self`), as far as serving is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgType {
    Tensor,
    OptionalTensor,
    Int,
    Float,
    Bool,
    Str,
    StrList,
    /// `Dict[str, Tensor]`: as the only argument, every config input is one of its keys.
    TensorDict,
    /// Any other type, kept as written for the error that names it.
    Other(String),
}

impl ArgType {
    fn parse(text: &str) -> ArgType {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        match compact.as_str() {
            "Tensor" => ArgType::Tensor,
            "Optional[Tensor]" => ArgType::OptionalTensor,
            "int" => ArgType::Int,
            "float" => ArgType::Float,
            "bool" => ArgType::Bool,
            "str" => ArgType::Str,
            "List[str]" => ArgType::StrList,
            "Dict[str,Tensor]" => ArgType::TensorDict,
            _ => ArgType::Other(text.trim().to_string()),
        }
    }

    /// True for arguments that take one value rather than a tensor (they cannot be batched).
    pub fn is_scalar(&self) -> bool {
        matches!(self, ArgType::Int | ArgType::Float | ArgType::Bool | ArgType::Str)
    }
}

/// One forward() argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    pub name: String,
    pub ty: ArgType,
    /// Whether the signature gives it a default (it may then be left out at the end of the call).
    pub has_default: bool,
}

/// The module path and class name of the archive's top object, from the GLOBAL opcode that opens
/// `data.pkl` (TorchScript pickles with protocol 2: `\x80\x02c<module>\n<class>\n`).
pub fn top_class(pickle: &[u8]) -> Option<(String, String)> {
    let rest = pickle.strip_prefix(&[0x80, 0x02])?.strip_prefix(b"c")?;
    let mut lines = rest.splitn(3, |&b| b == b'\n');
    let module = std::str::from_utf8(lines.next()?).ok()?;
    let class = std::str::from_utf8(lines.next()?).ok()?;
    lines.next()?;
    let valid = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.');
    (valid(module) && valid(class)).then(|| (module.to_string(), class.to_string()))
}

/// The archive path (below its top folder) of the code file that defines classes of `module`.
pub fn code_path(module: &str) -> String {
    format!("code/{}.py", module.replace('.', "/"))
}

/// The arguments of `class`'s forward() in `code`, without `self`.
pub fn forward_args(code: &str, class: &str) -> Result<Vec<Arg>, String> {
    let header = format!("class {class}(");
    let start = code
        .match_indices(&header)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || code.as_bytes()[i - 1] == b'\n')
        .ok_or_else(|| format!("the code has no class {class}"))?;
    let body = &code[start + header.len()..];
    let body = body.find("\nclass ").map_or(body, |end| &body[..end]);
    let def = body
        .find("def forward(")
        .ok_or_else(|| format!("class {class} has no forward()"))?;
    let params = inside_parens(&body[def + "def forward".len()..])
        .ok_or_else(|| format!("cannot read the parameters of {class}.forward()"))?;
    let mut args = Vec::new();
    for (i, piece) in split_top_level(params).into_iter().enumerate() {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        let (decl, default) = match split_once_top_level(piece, '=') {
            Some((d, _)) => (d, true),
            None => (piece, false),
        };
        let (name, ty) = match decl.split_once(':') {
            Some((n, t)) => (n.trim(), ArgType::parse(t)),
            None => (decl.trim(), ArgType::Tensor),
        };
        if i == 0 && name == "self" {
            continue;
        }
        if name.starts_with('*') {
            return Err(format!(
                "{class}.forward() takes {name}, which cannot be bound to named inputs"
            ));
        }
        args.push(Arg {
            name: name.to_string(),
            ty,
            has_default: default,
        });
    }
    Ok(args)
}

/// The text between the first `(` of `s` and its matching `)`.
fn inside_parens(s: &str) -> Option<&str> {
    let open = s.find('(')?;
    let close = scan(&s[open..], |_, c, depth| matches!(c, ')' | ']' | '}') && depth == 1)?;
    Some(&s[open + 1..open + close])
}

/// Splits at commas outside brackets and quotes.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = s;
    while let Some((head, tail)) = split_once_top_level(rest, ',') {
        parts.push(head);
        rest = tail;
    }
    parts.push(rest);
    parts
}

/// Splits at the first `sep` outside brackets and quotes.
fn split_once_top_level(s: &str, sep: char) -> Option<(&str, &str)> {
    let at = scan(s, |_, c, depth| c == sep && depth == 0)?;
    Some((&s[..at], &s[at + sep.len_utf8()..]))
}

/// The index of the first character outside quoted strings for which `hit(index, char, depth)`
/// holds, where depth counts the brackets open before the character.
fn scan(s: &str, mut hit: impl FnMut(usize, char, i32) -> bool) -> Option<usize> {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        if hit(i, c, depth) {
            return Some(i);
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILERO_LIKE: &str = "class Other(Module):\n  def forward(self: __torch__.Other,\n    z: Tensor) -> Tensor:\n    return z\nclass VAD(Module):\n  __parameters__ = []\n  def forward(self: __torch__.a.b.VAD,\n    x: Tensor,\n    sr: int) -> Tensor:\n    _0 = \"Provided number of samples is {} (Supported)\"\n    return x\n  def reset_states(self: __torch__.a.b.VAD, batch_size: int=1) -> NoneType:\n    return None\n";

    #[test]
    fn reads_the_named_class_forward_only() {
        let args = forward_args(SILERO_LIKE, "VAD").unwrap();
        let names: Vec<_> = args.iter().map(|a| (a.name.as_str(), a.ty.clone())).collect();
        assert_eq!(names, vec![("x", ArgType::Tensor), ("sr", ArgType::Int)]);
        assert_eq!(forward_args(SILERO_LIKE, "Other").unwrap()[0].name, "z");
        assert!(forward_args(SILERO_LIKE, "Missing")
            .unwrap_err()
            .contains("no class Missing"));
    }

    #[test]
    fn types_defaults_and_nested_brackets() {
        let code = "class M(Module):\n  def forward(self: __torch__.M,\n    inputs: Dict[str, Tensor],\n    names: List[str],\n    state: Tensor=CONSTANTS.c0,\n    scale: float=1.,\n    tag: str=\"a,)b\",\n    maybe: Optional[Tensor]=None,\n    pair: Tuple[Tensor, Tensor]) -> Dict[str, Tensor]:\n    pass\n";
        let args = forward_args(code, "M").unwrap();
        let got: Vec<_> = args
            .iter()
            .map(|a| (a.name.as_str(), a.ty.clone(), a.has_default))
            .collect();
        assert_eq!(
            got,
            vec![
                ("inputs", ArgType::TensorDict, false),
                ("names", ArgType::StrList, false),
                ("state", ArgType::Tensor, true),
                ("scale", ArgType::Float, true),
                ("tag", ArgType::Str, true),
                ("maybe", ArgType::OptionalTensor, true),
                ("pair", ArgType::Other("Tuple[Tensor, Tensor]".into()), false),
            ]
        );
    }

    #[test]
    fn a_class_name_that_is_a_suffix_of_another_is_not_confused() {
        let code = "class XM(Module):\n  def forward(self, a: Tensor) -> Tensor:\n    pass\nclass M(Module):\n  def forward(self, b: Tensor) -> Tensor:\n    pass\n";
        assert_eq!(forward_args(code, "M").unwrap()[0].name, "b");
    }

    #[test]
    fn the_top_class_comes_from_the_pickle_header() {
        let pkl = b"\x80\x02c__torch__.vad.model\nVADRNN\nq\x00)\x81}";
        assert_eq!(top_class(pkl), Some(("__torch__.vad.model".into(), "VADRNN".into())));
        assert_eq!(code_path("__torch__.vad.model"), "code/__torch__/vad/model.py");
        assert_eq!(top_class(b"\x80\x04\x95"), None, "not protocol 2");
        assert_eq!(top_class(b"\x80\x02c../etc\npasswd\n"), None, "no path characters");
        assert_eq!(top_class(b""), None);
    }

    #[test]
    fn unbalanced_or_odd_signatures_are_errors_not_panics() {
        assert!(forward_args("class M(Module):\n  def forward(self, x: Tensor", "M").is_err());
        assert!(forward_args("class M(Module):\n  def forward(self, *args):\n", "M").is_err());
        assert!(forward_args("class M(Module):\n  x = 1\n", "M").is_err());
    }
}
