//! Scenario 4, watch: kubectl's watch of resourceclaims through Envoy sees every write, in
//! order, and never ends by itself.

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_harness::cluster::Cluster;
use skewgate_harness::kubectl::Kubectl;
use skewgate_harness::scenario::KillOnDrop;

use super::CLAIMS;

/// A watch event or a write: (type, name, resourceVersion).
pub type Event = (String, String, String);

/// `kubectl get resourceclaims -w` in a namespace, its events read as they come.
pub struct Watch {
    child: KillOnDrop,
    pub events: Receiver<Event>,
    stderr: PathBuf,
}

impl Watch {
    pub fn start(k: &Kubectl, c: &Cluster, namespace: &str) -> Result<Self> {
        let stderr = c.out.join("watch.stderr");
        // No --request-timeout: a watch must not end on a client deadline.
        let mut child = KillOnDrop(
            k.std_command(&["get", CLAIMS, "-n", namespace, "-w", "--output-watch-events", "-o", "json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::fs::File::create(&stderr)?)
                .spawn()?,
        );
        let stdout = child.0.stdout.take().context("watch stdout")?;
        let (tx, events) = std::sync::mpsc::channel::<Event>();
        std::thread::spawn(move || {
            // kubectl prints one JSON object per event.
            for event in serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>() {
                let Ok(e) = event else { break };
                let meta = &e["object"]["metadata"];
                let field = |v: &Value| v.as_str().unwrap_or("").to_string();
                if tx
                    .send((field(&e["type"]), field(&meta["name"]), field(&meta["resourceVersion"])))
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(Self { child, events, stderr })
    }

    /// The events of `written` (for 15 s at most), then the watch ends: it must still have been
    /// running.
    pub fn stop_after(mut self, written: &[Event]) -> Result<Vec<Event>> {
        let mut received = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while received.len() < written.len() && Instant::now() < deadline {
            if let Ok(event) = self.events.recv_timeout(Duration::from_millis(100)) {
                received.push(event);
            }
        }
        let still_running = self.child.0.try_wait()?.is_none();
        drop(self.child);
        ensure!(
            still_running,
            "kubectl's watch ended by itself:\n{}",
            std::fs::read_to_string(&self.stderr)?
        );
        Ok(received)
    }
}

/// A claim of no devices.
pub fn claim(name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name}, "spec": {"devices": {"requests": []}}})
}

/// One write a second through `claims` (a resourceclaims collection's URL) for `lasting`:
/// create, patch, delete, create, ...
pub async fn write_claims(alice: &reqwest::Client, claims: &str, lasting: Duration) -> Result<Vec<Event>> {
    let started = Instant::now();
    let mut written: Vec<Event> = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut step = 0usize;
    while started.elapsed() < lasting {
        ticker.tick().await;
        let name = format!("claim-{}", step / 3);
        let (kind, response) = match step % 3 {
            0 => ("ADDED", alice.post(claims).json(&claim(&name)).send().await?),
            1 => {
                let patch = json!({"metadata": {"labels": {"step": step.to_string()}}});
                let req = alice
                    .patch(format!("{claims}/{name}"))
                    .header("content-type", "application/merge-patch+json");
                ("MODIFIED", req.body(patch.to_string()).send().await?)
            }
            _ => ("DELETED", alice.delete(format!("{claims}/{name}")).send().await?),
        };
        let status = response.status();
        ensure!(status.is_success(), "{kind} {name}: {status} {}", response.text().await?);
        let object: Value = response.json().await?;
        let rv = object["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
        written.push((kind.to_string(), name, rv));
        step += 1;
    }
    Ok(written)
}

/// Every written event received, in order; deletions compared by name (their resourceVersion
/// is the deletion's, which the DELETE answer need not carry).
pub fn same_events(written: &[Event], received: &[Event]) -> Result<()> {
    let key =
        |e: &Event| if e.0 == "DELETED" { (e.0.clone(), e.1.clone(), String::new()) } else { e.clone() };
    let want: Vec<_> = written.iter().map(key).collect();
    let got: Vec<_> = received.iter().map(key).collect();
    ensure!(got == want, "the watch missed or reordered events:\nwant {want:?}\ngot  {got:?}");
    Ok(())
}
