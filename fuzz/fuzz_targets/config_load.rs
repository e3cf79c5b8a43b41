//! The config loader on arbitrary text: what `rangeway check` and `rangeway serve` do with a file.
//!
//! Input: the file's bytes (invalid UTF-8 is what `Config::load` refuses before parsing, so only
//! text goes on). Checks (`check_config_text`): no panic; a refusal reports at least one problem,
//! each with a non-empty key path, problem and fix, the same ones on a second load; an accepted
//! text loads again to the same configuration, and its chains build (or are refused) the same way.
//!
//! Loading reads the environment (`admin_token_env`, `key_env`) and may inspect paths the text
//! names (`ca_file`, `key_file`, `dir`); it never writes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = rangeway_fuzz::check_config_text(text);
    }
});
