//! Why a download did not end well, and the exit code that says so.

/// Each kind has its own exit code (docs/get.md lists them).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// Bad arguments or local set-up (a key file, `--cacert`): exit 2.
    #[error("{0}")]
    Usage(String),
    /// The server could not be reached, or kept failing, for longer than `--retry-for`: exit 1.
    #[error("{0}")]
    Network(String),
    /// The server answered with an error the client cannot retry (404, 403, 410...): exit 6.
    #[error("{url}: the server answered {status}{detail}")]
    Refused { url: String, status: u16, detail: String },
    /// The server answered something other than what was asked (another range, a length that
    /// does not add up): nothing of it was written. Exit 4.
    #[error("{0}")]
    Server(String),
    /// The file does not match a digest the server (or `--sha256`) states: exit 3.
    #[error("{0}")]
    Verification(String),
    /// `--decrypt` or `--gunzip` failed on the downloaded file: exit 7.
    #[error("{0}")]
    Decode(String),
    /// Writing the file failed: exit 5.
    #[error("{0}")]
    Local(String),
}

impl GetError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Network(_) => 1,
            Self::Usage(_) => 2,
            Self::Verification(_) => 3,
            Self::Server(_) => 4,
            Self::Local(_) => 5,
            Self::Refused { .. } => 6,
            Self::Decode(_) => 7,
        }
    }
}
