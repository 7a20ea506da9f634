//! What the sidecar and Envoy logged around the requests a run got wrong. A run's logs are
//! deleted with its directory (unless kept); a check that fails prints this instead, so that a
//! failure on a machine nobody can look into afterwards (CI) can still be read.

use std::path::Path;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{Class, Request};

/// Failed requests looked into, at most.
const REQUESTS: usize = 10;
/// Lines quoted from each log, at most.
const LINES: usize = 40;
/// How far before a failed request the sidecar's log is read: what it did about the apiserver
/// in the moments that led there.
const SIDECAR_BEFORE: f64 = 3.0;

/// The failed requests of a run: errors, and 503s that are not explained by every server of
/// their GVR being away.
pub fn failed(records: &[Request]) -> Vec<&Request> {
    records
        .iter()
        .filter(|r| Class::ERRORS.contains(&r.class) && !(r.class == Class::Unavailable && r.expected))
        .take(REQUESTS)
        .collect()
}

/// The lines of `dir`'s sidecar log and Envoy log written while the failed requests of a run
/// whose load started at `epoch` were under way (the sidecar's, from a few seconds before each).
/// `None` when nothing failed.
pub fn gather(dir: &Path, epoch: OffsetDateTime, records: &[Request]) -> Option<String> {
    let failed = failed(records);
    if failed.is_empty() {
        return None;
    }
    let at = |seconds: f64| epoch + time::Duration::seconds_f64(seconds);
    let windows = |before: f64, after: f64| -> Vec<(OffsetDateTime, OffsetDateTime)> {
        failed.iter().map(|r| (at(r.t - before), at(r.t + r.latency_ms / 1000.0 + after))).collect()
    };
    let mut out = String::from("\n\nwhat the sidecar and Envoy logged meanwhile (UTC):");
    for (name, path, windows, only_log) in [
        ("sidecar", dir.join("sidecar.log"), windows(SIDECAR_BEFORE, 0.5), true),
        ("Envoy", dir.join("envoy/envoy.log"), windows(0.1, 0.1), false),
    ] {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| !only_log || !line.starts_with(' '))
            .filter(|line| stamp(line).is_some_and(|t| windows.iter().any(|(a, b)| *a <= t && t <= *b)))
            .collect();
        out.push_str(&format!(
            "\n{name} ({} of {} lines in the windows):",
            lines.len().min(LINES),
            lines.len()
        ));
        for line in lines.iter().take(LINES) {
            out.push_str("\n  ");
            out.push_str(line);
        }
    }
    Some(out)
}

/// The time a log line starts with: the sidecar's `2026-11-28T11:40:32.644184Z …`, Envoy's
/// access log `[2026-11-28T11:53:17.935Z] …` and its own `[2026-11-28 11:53:17.935][…`.
fn stamp(line: &str) -> Option<OffsetDateTime> {
    let head = match line.strip_prefix('[') {
        Some(rest) => rest.split(']').next()?,
        None => line.split(' ').next()?,
    };
    let normal = head.replacen(' ', "T", 1);
    let normal = if normal.ends_with('Z') { normal } else { format!("{normal}Z") };
    OffsetDateTime::parse(&normal, &Rfc3339).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wrong 404 five seconds into the load: the sidecar's lines from three seconds before it
    /// to its end, Envoy's while it was under way, backtraces left out.
    #[test]
    fn the_logs_around_a_failed_request_are_quoted() {
        let dir = std::env::temp_dir().join(format!("drill-evidence-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("envoy")).unwrap();
        std::fs::write(
            dir.join("sidecar.log"),
            "2026-11-28T11:00:01.500Z  INFO too early\n\
             2026-11-28T11:00:04.000Z  INFO out of every Envoy cluster apiserver=\"b\"\n   0: a backtrace line\n\
             2026-11-28T11:00:05.400Z  INFO eligible again apiserver=\"b\"\n\
             2026-11-28T11:00:06.000Z  INFO too late\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("envoy/envoy.log"),
            "[2026-11-28T11:00:04.500Z] \"GET /early\" 200\n\
             [2026-11-28T11:00:05.050Z] \"GET /apis/storage.k8s.io/v1/volumeattributesclasses\" 404\n",
        )
        .unwrap();
        let epoch = OffsetDateTime::parse("2026-11-28T11:00:00Z", &Rfc3339).unwrap();
        let mut ok = Request::start(
            std::time::Duration::from_secs(1),
            "pods.v1".into(),
            "list",
            crate::Era::Both,
            None,
        );
        ok.latency_ms = 10.0;
        assert_eq!(gather(&dir, epoch, std::slice::from_ref(&ok)), None);
        let mut wrong =
            Request::start(std::time::Duration::from_secs(5), "x".into(), "list", crate::Era::New, None);
        wrong.latency_ms = 100.0;
        wrong.class = Class::WrongNotFound;
        let text = gather(&dir, epoch, &[ok, wrong]).unwrap();
        assert!(text.contains("out of every Envoy cluster") && text.contains("eligible again"), "{text}");
        assert!(text.contains("volumeattributesclasses") && !text.contains("/early"), "{text}");
        assert!(
            !text.contains("too early") && !text.contains("too late") && !text.contains("backtrace"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_log_line_kind_has_its_time() {
        let sidecar = "2026-11-28T11:40:32.644184Z  INFO skewgate::sync: eligible again apiserver=\"b\"";
        let access = "[2026-11-28T11:53:17.935Z] \"GET /apis HTTP/2\" 503 UH no_healthy_upstream";
        let own = "[2026-11-28 11:53:17.935][12][warning][config] something";
        let t = |s: &str| stamp(s).map(|t| (t.hour(), t.minute(), t.second(), t.millisecond()));
        assert_eq!(t(sidecar), Some((11, 40, 32, 644)));
        assert_eq!(t(access), Some((11, 53, 17, 935)));
        assert_eq!(t(own), Some((11, 53, 17, 935)));
        assert_eq!(t("   0: anyhow::error"), None);
        assert_eq!(t("==== skewgate sync --config x"), None);
    }
}
