//! The PROXY protocol header parser (`rangeway::proxy_protocol::parse`) on arbitrary bytes.
//!
//! Checks what `admission.rs` relies on when it reads a connection's first bytes: no panic; a
//! header's length is within the bytes given, and parsing just those bytes gives the same
//! header (nothing after it was looked at); an incomplete answer asks for more bytes than it was
//! given; and reading exactly as asked, from the first byte, arrives at the same answer without
//! ever asking past the header's end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rangeway::proxy_protocol::{Parsed, parse};

fuzz_target!(|input: &[u8]| {
    let whole = parse(input);
    match &whole {
        Ok(Parsed::Header { len, .. }) => {
            assert!(*len <= input.len(), "a header of {len} bytes in {}", input.len());
            assert_eq!(parse(&input[..*len]), whole, "the header alone");
        }
        Ok(Parsed::Incomplete { at_least }) => {
            assert!(*at_least > input.len(), "asked for {at_least} with {}", input.len());
        }
        Err(_) => {}
    }
    // As the connection is read: exactly the bytes asked for, each time.
    let mut have = 0;
    loop {
        match parse(&input[..have]) {
            Ok(Parsed::Incomplete { at_least }) if at_least <= input.len() => {
                assert!(at_least > have, "no progress at {have}");
                have = at_least;
            }
            // The input ends first: a header within it would have been reached (a refusal may
            // come only once the first bytes asked for are in).
            Ok(Parsed::Incomplete { .. }) => {
                assert!(!matches!(whole, Ok(Parsed::Header { .. })), "{whole:?} at {have}");
                break;
            }
            read_as_asked => {
                assert_eq!(read_as_asked, whole, "read as asked, to {have}");
                break;
            }
        }
    }
});
