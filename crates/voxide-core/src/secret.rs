//! Keys and tokens: one type that never shows its value in `Debug`, an error or a log line.
//! Code that must send a secret asks for it by name ([`Secret::expose`]).

use std::fmt;

/// A provider key, an auth token or a shared secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it (a header, a signature, a URL parameter).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the value is empty (or only blanks).
    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_in_debug() {
        let key = Secret::new("sk-live-1234");
        assert_eq!(format!("{key:?}"), "Secret(<redacted>)");
        assert_eq!(
            format!("{:?}", Some(key.clone())),
            "Some(Secret(<redacted>))"
        );
        assert_eq!(key.expose(), "sk-live-1234");
    }
}
