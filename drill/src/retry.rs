//! When client-go sends a request again, and after how long: the rule the drill's client-go-like
//! client follows, so that its failures are the ones kubectl, controllers and the kubelet see.
//!
//! client-go (`rest.Request.request`, `withRetry.IsNextRetry`) sends a request again only when
//! the server said when to: a 429 or any 5xx carrying an integer `Retry-After`, waiting that many
//! seconds. A broken connection counts as `Retry-After: 1`, but only for a GET that was reset or
//! cut short (a write may have been carried out). A body given as an opaque reader is never sent
//! twice; an encoded object (what typed clients send) is. At most 10 times after the first.

use std::time::Duration;

/// client-go's default `maxRetries`.
pub const MAX_RETRIES: u32 = 10;

/// What the request carries, as client-go holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    /// Encoded bytes (typed and dynamic clients, kubectl): a fresh reader for every attempt.
    Encoded,
    /// A caller's `io.Reader`: it cannot be rewound, so the request is never sent again.
    Reader,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    Answered {
        status: u16,
        /// The `Retry-After` header, as sent.
        retry_after: Option<&'a str>,
    },
    /// No answer. `reset_or_eof`: the connection was reset or closed under the request (what
    /// client-go's `IsConnectionReset`/`IsProbableEOF` recognise), as opposed to refused or
    /// timed out.
    NoAnswer { reset_or_eof: bool },
}

/// How long to wait before sending the request again, or `None` to give its outcome to the
/// caller. `attempts`: attempts made, the one that ended in `outcome` included.
pub fn again(get: bool, body: Body, attempts: u32, outcome: Outcome<'_>) -> Option<Duration> {
    if body == Body::Reader || attempts > MAX_RETRIES {
        return None;
    }
    match outcome {
        Outcome::NoAnswer { reset_or_eof } => (get && reset_or_eof).then_some(Duration::from_secs(1)),
        Outcome::Answered { status, retry_after } if status == 429 || status >= 500 => {
            // Go's strconv.Atoi: an optional sign, digits, nothing else; a negative wait is none.
            let seconds: i64 = retry_after?.parse().ok()?;
            Some(Duration::from_secs(seconds.max(0).unsigned_abs()))
        }
        Outcome::Answered { .. } => None,
    }
}
