//! Small files a config value names (a CA bundle, a key file, AWS credentials), read whole.

use std::io::Read as _;

/// The contents of `file`, or what is wrong with it. Only regular files: a FIFO without a writer
/// would block the load forever, and a device such as `/dev/zero` has no end. Read through
/// `take`, as a file may grow.
pub(crate) fn read_small_file(file: &str, max_len: u64) -> Result<Vec<u8>, String> {
    match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{file:?} does not exist"));
        }
        Err(e) => return Err(format!("{file:?} cannot be inspected: {e}")),
        Ok(meta) if !meta.is_file() => return Err(format!("{file:?} is not a regular file")),
        Ok(_) => {}
    }
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(max_len + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{file:?} cannot be read: {e}"))?;
    if bytes.len() as u64 > max_len {
        return Err(format!("{file:?} is larger than {} KiB", max_len / 1024));
    }
    Ok(bytes)
}

/// A credentials or key file: small (at most 1 MiB), regular, UTF-8.
pub(crate) fn read_text(file: &str) -> Result<String, String> {
    let bytes = read_small_file(file, 1 << 20)?;
    String::from_utf8(bytes).map_err(|_| format!("{file:?} is not UTF-8 text"))
}
