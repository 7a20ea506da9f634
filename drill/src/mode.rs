//! Which Envoy a drill run's load goes through, and what that means for its cluster.

use serde::Serialize;
use skewgate_harness::cluster;

/// Which Envoy the load goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// `envoy-config/plain-lb.yaml`: no filter, no sidecar, a static pool of the three.
    PlainLb,
    /// The skewgate filter and `skewgate sync` (`Options::poll`).
    Skewgate,
    /// Real binaries only: the plain load balancer in front of kube-apiservers that run
    /// Kubernetes' own Mixed Version Proxy ([`skewgate_harness::mvp`]).
    Mvp,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::PlainLb => "plain LB",
            Mode::Mvp => "in-apiserver MVP",
            Mode::Skewgate => "skewgate",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Mode::PlainLb => "plain-lb",
            Mode::Mvp => "mvp",
            Mode::Skewgate => "skewgate",
        }
    }

    /// The runs of a drill, in docs/drill.md's column order.
    pub fn all(real: bool) -> &'static [Mode] {
        match real {
            true => &[Mode::PlainLb, Mode::Mvp, Mode::Skewgate],
            false => &[Mode::PlainLb, Mode::Skewgate],
        }
    }

    pub(crate) fn cluster_options(self, options: &mut cluster::Options) {
        options.sidecar = self == Mode::Skewgate;
        options.plain_lb = self != Mode::Skewgate;
        options.mvp = self == Mode::Mvp;
    }
}
