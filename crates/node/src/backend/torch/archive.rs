//! Opens a TorchScript file as the zip archive it is, to tell "not TorchScript" apart early and
//! to read forward()'s signature from the code it carries.
use std::io::Read;
use std::path::Path;

use super::signature::{self, Arg};

/// Code files beyond this size are not read for the signature (real ones are kilobytes).
const MAX_CODE_BYTES: u64 = 16 << 20;

/// The top class's forward() arguments, as far as the archive tells them.
pub enum Signature {
    Known(Vec<Arg>),
    /// The archive does not say (why, for the log); inputs then bind by the `<name>__<index>`
    /// convention or config order.
    Unknown(String),
}

/// Reads `file`'s signature; an error means it is missing or not a TorchScript archive at all.
pub fn read(file: &Path) -> Result<Signature, String> {
    let f = std::fs::File::open(file).map_err(|e| format!("cannot open {}: {e}", file.display()))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(f)).map_err(|e| {
        format!(
            "{} is not a TorchScript archive (torch.jit.save writes a zip file; this one is not: {e})",
            file.display()
        )
    })?;
    let Some(pickle_name) = zip
        .file_names()
        .find(|n| top_level_entry(n, "data.pkl"))
        .map(str::to_string)
    else {
        return Err(format!(
            "{} is a zip file but not a TorchScript archive (it has no data.pkl)",
            file.display()
        ));
    };
    let prefix = pickle_name.strip_suffix("data.pkl").unwrap_or_default().to_string();
    let unknown = Signature::Unknown;
    let mut head = Vec::new();
    if let Err(e) = zip
        .by_name(&pickle_name)
        .and_then(|f| Ok(f.take(4096).read_to_end(&mut head)?))
    {
        return Ok(unknown(format!("data.pkl is unreadable: {e}")));
    }
    let Some((module, class)) = signature::top_class(&head) else {
        return Ok(unknown("data.pkl does not start with the module's class".into()));
    };
    let code_name = format!("{prefix}{}", signature::code_path(&module));
    let mut code = String::new();
    let read = zip
        .by_name(&code_name)
        .and_then(|f| Ok(f.take(MAX_CODE_BYTES).read_to_string(&mut code)?));
    if let Err(e) = read {
        return Ok(unknown(format!("{code_name} is unreadable: {e}")));
    }
    Ok(match signature::forward_args(&code, &class) {
        Ok(args) => Signature::Known(args),
        Err(e) => unknown(e),
    })
}

/// True for `<top folder>/<leaf>` (or a bare `<leaf>`): the archive's own entry, not a nested one.
fn top_level_entry(name: &str, leaf: &str) -> bool {
    match name.strip_suffix(leaf) {
        Some("") => true,
        Some(dir) => dir.ends_with('/') && !dir[..dir.len() - 1].contains('/'),
        None => false,
    }
}
