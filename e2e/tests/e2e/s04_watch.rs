//! Scenario 4: Watch.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use skewgate_testkit::cluster::{Cluster, Credentials};
use skewgate_testkit::scenario::{KillOnDrop, Row, kubectl, scenario, until};

use crate::support::{CLAIMS, ERAS, TIMEOUT, finish, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_watch() -> Result<()> {
    scenario("04", "watch 90 s", watch()).await
}

async fn watch() -> Result<Row> {
    let mut row = Row::default();
    let c = start("s04", ERAS, |_| {}).await?;
    let k = kubectl(&c)?;
    k.ok(&["create", "namespace", "e2e-watch"]).await?;
    row.requests += 1;
    // No --request-timeout: a watch must not end on a client deadline.
    let mut watch = KillOnDrop(
        k.std_command(&["get", CLAIMS, "-n", "e2e-watch", "-w", "--output-watch-events", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(c.out.join("watch.stderr"))?)
            .spawn()?,
    );
    let stdout = watch.0.stdout.take().context("watch stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<(String, String, String)>();
    std::thread::spawn(move || {
        // kubectl prints one JSON object per event.
        for event in serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>() {
            let Ok(e) = event else { break };
            let meta = &e["object"]["metadata"];
            let field = |v: &Value| v.as_str().unwrap_or("").to_string();
            if tx.send((field(&e["type"]), field(&meta["name"]), field(&meta["resourceVersion"]))).is_err() {
                break;
            }
        }
    });
    let watches = |c: &Cluster| -> BTreeMap<String, u64> {
        c.standins
            .iter()
            .map(|s| (s.id.clone(), s.watch_requests().get(CLAIMS).copied().unwrap_or(0)))
            .collect()
    };
    until("kubectl's watch reaches an apiserver", Duration::from_secs(15), || {
        Ok((watches(&c).values().sum::<u64>() == 1).then_some(()))
    })
    .await?;
    let opened = Instant::now();

    // One write a second for 90 s through Envoy: create, patch, delete, create, ...
    let alice = c.client(Credentials::Alice, TIMEOUT)?;
    let base = format!("{}/apis/resource.k8s.io/v1/namespaces/e2e-watch/resourceclaims", c.envoy_url()?);
    let mut written: Vec<(String, String, String)> = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut step = 0usize;
    while opened.elapsed() < Duration::from_secs(90) {
        ticker.tick().await;
        let name = format!("claim-{}", step / 3);
        let (kind, response) = match step % 3 {
            0 => {
                let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name}, "spec": {"devices": {"requests": []}}});
                ("ADDED", alice.post(&base).json(&body).send().await?)
            }
            1 => {
                let patch = json!({"metadata": {"labels": {"step": step.to_string()}}});
                let req = alice
                    .patch(format!("{base}/{name}"))
                    .header("content-type", "application/merge-patch+json");
                ("MODIFIED", req.body(patch.to_string()).send().await?)
            }
            _ => ("DELETED", alice.delete(format!("{base}/{name}")).send().await?),
        };
        let status = response.status();
        ensure!(status.is_success(), "{kind} {name}: {status} {}", response.text().await?);
        let object: Value = response.json().await?;
        let rv = object["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
        written.push((kind.to_string(), name, rv));
        step += 1;
    }
    row.requests += written.len();

    let mut received: Vec<(String, String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while received.len() < written.len() && Instant::now() < deadline {
        if let Ok(event) = rx.recv_timeout(Duration::from_millis(100)) {
            received.push(event);
        }
    }
    let open_for = opened.elapsed();
    let still_running = watch.0.try_wait()?.is_none();
    drop(watch);
    ensure!(
        still_running,
        "kubectl's watch ended by itself:\n{}",
        std::fs::read_to_string(c.out.join("watch.stderr"))?
    );
    // Every event, in order; deletions compared by name (their resourceVersion is the
    // deletion's, which the DELETE answer need not carry).
    let key = |e: &(String, String, String)| {
        if e.0 == "DELETED" { (e.0.clone(), e.1.clone(), String::new()) } else { e.clone() }
    };
    let want: Vec<_> = written.iter().map(key).collect();
    let got: Vec<_> = received.iter().map(key).collect();
    assert_eq!(got, want, "the watch missed or reordered events");
    let watch_requests = watches(&c);
    println!(
        "watch open {open_for:.1?}: {} events written, {} received; watch requests per apiserver \
         {watch_requests:?}",
        written.len(),
        received.len()
    );
    assert_eq!(
        watch_requests,
        BTreeMap::from([("a".into(), 0), ("b".into(), 0), ("c".into(), 1)]),
        "reconnects"
    );
    row.figure(format!(
        "open {:.0}s, {} events written, {} received, watch requests {watch_requests:?}",
        open_for.as_secs_f64(),
        written.len(),
        received.len()
    ));
    finish(c, &mut row).await?;
    Ok(row)
}
