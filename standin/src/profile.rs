//! Version profiles: which discovery documents a stand-in apiserver serves, taken from real
//! kube-apiserver discovery of three Kubernetes eras, minus the group/versions switched off for
//! one instance (as `--runtime-config` would); or (`1.33-real`, `1.36-real`) every document a
//! real kube-apiserver v1.36.2 served, as captured.

use anyhow::{Context, Result, anyhow, bail};
use skewgate_core::discovery::{ApiGroupDiscoveryList, ApiResourceList, core_group_list};

use super::captured::{self, Capture};

const V1_30: &str =
    include_str!("../../testdata/discovery/k8s-1.30-era_resource-v1alpha2/aggregated_v2.json");
const V1_33: &str = include_str!("../../testdata/discovery/k8s-1.33-era_resource-v1beta2/aggregated_v2.json");
const V1_36: &str = include_str!("../../testdata/discovery/k8s-1.36-era_resource-v1/aggregated_v2.json");
/// The fixtures' `/apis` never holds the core group; every era serves this `/api/v1`.
const CORE_V1: &str = include_str!("../../testdata/discovery/legacy_core-v1/api__v1.json");

/// (era, gitVersion, Go version of that release, `/apis` fixture).
const ERAS: [(&str, &str, &str, &str); 3] = [
    ("1.30", "v1.30.0", "go1.22.2", V1_30),
    ("1.33", "v1.33.0", "go1.24.2", V1_33),
    ("1.36", "v1.36.0", "go1.25.5", V1_36),
];

/// The real profiles: name, captured server.
const REAL: [(&str, Capture); 2] = [("1.33-real", Capture::Emulated133), ("1.36-real", Capture::Native136)];

/// What one stand-in serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `1.30`, `1.33` or `1.36`: the API set's minor version (`1.33` for `1.33-real`).
    pub era: String,
    /// `/version`'s gitVersion, e.g. `v1.33.0`.
    pub git_version: String,
    /// Aggregated `/api`: the core group only.
    pub api: ApiGroupDiscoveryList,
    /// Aggregated `/apis`, without the disabled group/versions.
    pub apis: ApiGroupDiscoveryList,
    /// `1.33-real` and `1.36-real`: the real server whose captured documents are served as
    /// they are.
    pub capture: Option<Capture>,
}

impl Profile {
    /// Whether the era's kube-apiserver has the `WatchList` feature gate on by default: 1.30
    /// (beta, off) and 1.33 (off) refuse streaming lists, 1.34 and later serve them.
    pub fn watch_list(&self) -> bool {
        !matches!(self.era.as_str(), "1.30" | "1.33")
    }

    /// Whether the era's kube-apiserver has the `VolumeAttributesClass` feature gate on by
    /// default: beta and off through 1.33, on from 1.34. Off, it drops a claim's
    /// `spec.volumeAttributesClassName` on write unless the stored claim has one.
    pub fn volume_attributes_class(&self) -> bool {
        !matches!(self.era.as_str(), "1.30" | "1.33")
    }

    /// `1.36`, `1.36:disable=resource.k8s.io/v1beta1,storage.k8s.io/v1alpha1` or `1.36-real`.
    /// An unknown era, an unknown option or a disable naming a group/version the era lacks is
    /// an error; a real profile takes no options (its documents are served as captured).
    pub fn parse(spec: &str) -> Result<Profile> {
        let mut parts = spec.trim().split(':');
        let era = parts.next().unwrap_or_default();
        if let Some((_, capture)) = REAL.iter().find(|(name, _)| *name == era) {
            if parts.next().is_some() {
                bail!("profile {spec:?}: {era} serves the captured documents as they are, without options");
            }
            return Profile::real(*capture);
        }
        let mut profile = Profile::era(era)?;
        for option in parts {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| anyhow!("profile {spec:?}: {option:?} is not key=value"))?;
            match key {
                "disable" => {
                    for gv in value.split(',').map(str::trim).filter(|gv| !gv.is_empty()) {
                        profile.disable(gv).with_context(|| format!("profile {spec:?}"))?;
                    }
                }
                _ => bail!("profile {spec:?}: unknown option {key:?} (known: disable)"),
            }
        }
        Ok(profile)
    }

    /// The whole discovery of an era.
    pub fn era(era: &str) -> Result<Profile> {
        let (era, git_version, _, apis) = ERAS.iter().find(|(name, ..)| *name == era).ok_or_else(|| {
            let known: Vec<&str> = ERAS.iter().map(|e| e.0).chain(REAL.iter().map(|r| r.0)).collect();
            anyhow!("unknown Kubernetes era {era:?} (known: {})", known.join(", "))
        })?;
        let apis = ApiGroupDiscoveryList::from_json(apis.as_bytes())
            .map_err(|e| anyhow!("fixture /apis of era {era}: {e:?}"))?;
        let core =
            ApiResourceList::from_json(CORE_V1.as_bytes()).map_err(|e| anyhow!("fixture /api/v1: {e:?}"))?;
        Ok(Profile {
            era: era.to_string(),
            git_version: git_version.to_string(),
            api: core_group_list(&core),
            apis,
            capture: None,
        })
    }

    /// Everything the captured server served.
    pub fn real(capture: Capture) -> Result<Profile> {
        let documents = captured::documents(capture)?;
        let list = |file: &str| {
            ApiGroupDiscoveryList::from_json(documents.file(file)?)
                .map_err(|e| anyhow!("{}/{file}: {e:?}", capture.folder()))
        };
        let version: serde_json::Value = serde_json::from_slice(documents.file("version.json")?)?;
        let field = |name: &str| version[name].as_str().unwrap_or_default().to_string();
        Ok(Profile {
            era: format!("{}.{}", field("emulationMajor"), field("emulationMinor")),
            git_version: field("gitVersion"),
            api: list("discovery/api.aggregated_v2.json")?,
            apis: list("discovery/apis.aggregated_v2.json")?,
            capture: Some(capture),
        })
    }

    /// What `--profile` names it: `1.36-real`, or the era.
    pub fn name(&self) -> &str {
        match self.capture {
            Some(capture) => REAL.iter().find(|r| r.1 == capture).map_or(self.era.as_str(), |r| r.0),
            None => &self.era,
        }
    }

    /// Whether aggregated discovery also speaks `apidiscovery.k8s.io/v2beta1`: up to 1.35
    /// (1.36 answers it 406, emulated or not).
    pub fn serves_v2beta1(&self) -> bool {
        self.capture.is_none() && self.era != "1.36"
    }

    /// Removes `group/version` from `/apis`; a group left without versions goes too.
    pub fn disable(&mut self, group_version: &str) -> Result<()> {
        if self.capture.is_some() {
            bail!(
                "cannot disable {group_version}: {} serves the captured documents as they are",
                self.name()
            );
        }
        let (group, version) = group_version
            .split_once('/')
            .filter(|(g, v)| !g.is_empty() && !v.is_empty() && !v.contains('/'))
            .ok_or_else(|| {
                anyhow!("cannot disable {group_version:?}: expected <group>/<version> (core v1 stays)")
            })?;
        let found = self.apis.items.iter_mut().find(|g| g.name() == group).and_then(|g| {
            let before = g.versions.len();
            g.versions.retain(|v| v.version != version);
            (g.versions.len() < before).then_some(())
        });
        if found.is_none() {
            bail!("cannot disable {group_version}: era {} does not serve it", self.era);
        }
        self.apis.items.retain(|g| !g.versions.is_empty());
        Ok(())
    }

    /// The Go version `/version` reports for this era's release.
    pub fn go_version(&self) -> &'static str {
        ERAS.iter().find(|e| e.0 == self.era).map_or("go1.24.2", |e| e.2)
    }

    /// `(major, minor)` of the era, e.g. `("1", "33")`.
    pub fn major_minor(&self) -> (&str, &str) {
        self.era.split_once('.').unwrap_or((&self.era, "0"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_gv(profile: &Profile, group: &str, version: &str) -> bool {
        profile
            .apis
            .items
            .iter()
            .any(|g| g.name() == group && g.versions.iter().any(|v| v.version == version))
    }

    #[test]
    fn eras_and_disables() {
        let p = Profile::parse("1.33:disable=resource.k8s.io/v1beta1,storage.k8s.io/v1alpha1").unwrap();
        assert_eq!(p.era, "1.33");
        assert_eq!(p.git_version, "v1.33.0");
        assert!(has_gv(&p, "resource.k8s.io", "v1beta2"));
        assert!(!has_gv(&p, "resource.k8s.io", "v1beta1"));
        assert!(!has_gv(&p, "storage.k8s.io", "v1alpha1"));
        assert!(has_gv(&p, "storage.k8s.io", "v1"));
        // The 1.36 era has no storage.k8s.io/v1alpha1 left to disable.
        assert!(Profile::parse("1.36:disable=storage.k8s.io/v1alpha1").is_err());
        assert!(has_gv(
            &Profile::parse("1.36:disable=resource.k8s.io/v1beta1").unwrap(),
            "resource.k8s.io",
            "v1"
        ));
        assert_eq!(p.api.items.len(), 1);
        assert_eq!(p.api.items[0].name(), "");
        assert!(!has_gv(&Profile::parse("1.33").unwrap(), "resource.k8s.io", "v1"));
        assert!(has_gv(&Profile::parse("1.30").unwrap(), "resource.k8s.io", "v1alpha2"));
    }

    #[test]
    fn disabling_every_version_drops_the_group() {
        let p = Profile::parse("1.30:disable=resource.k8s.io/v1alpha2").unwrap();
        assert!(p.apis.items.iter().all(|g| g.name() != "resource.k8s.io"));
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |s: &str| format!("{:#}", Profile::parse(s).unwrap_err());
        assert!(err("1.99").contains("unknown Kubernetes era \"1.99\""));
        assert!(err("1.33:disable=resource.k8s.io/v1").contains("does not serve it"));
        assert!(err("1.33:disable=v1").contains("expected <group>/<version>"));
        assert!(err("1.33:enable=x/v1").contains("unknown option"));
        assert!(err("1.33:disable").contains("not key=value"));
    }
}
