//! PEP 440 versions and specifiers, the subset package managers meet in practice: release
//! numbers, pre-releases (`a`, `b`, `rc`), post and dev releases, local labels (`+cpu`,
//! ignored for comparison as PEP 440 says for specifiers without one), and the operators
//! `==`, `!=`, `>=`, `<=`, `>`, `<`, `~=` and `==X.*` / `!=X.*`, comma-separated.

use crate::SpecError;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;

/// A parsed version. Ordering follows PEP 440: `1.0.dev1 < 1.0a1 < 1.0 < 1.0.post1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    release: Vec<u64>,
    /// Pre-release: (0 = a, 1 = b, 2 = rc, number).
    pre: Option<(u8, u64)>,
    post: Option<u64>,
    dev: Option<u64>,
    text: String,
}

impl Version {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let bad = || SpecError::BadVersion(s.to_string());
        let text = s.trim();
        let body = text.trim_start_matches(['v', 'V']);
        let body = body
            .split('+')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let mut rest = body.as_str();
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let release_text = rest[..end].trim_end_matches('.');
        rest = &rest[end..];
        if release_text.is_empty() {
            return Err(bad());
        }
        let release = release_text
            .split('.')
            .map(|p| p.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?;
        let number = |rest: &mut &str| -> u64 {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let n = rest[..end].parse().unwrap_or(0);
            *rest = &rest[end..];
            n
        };
        let mut pre = None;
        let mut post = None;
        let mut dev = None;
        while !rest.is_empty() {
            rest = rest.trim_start_matches(['.', '-', '_']);
            if let Some(r) = rest.strip_prefix("rc").or_else(|| rest.strip_prefix('c')) {
                rest = r;
                pre = Some((2, number(&mut rest)));
            } else if let Some(r) = rest
                .strip_prefix("alpha")
                .or_else(|| rest.strip_prefix('a'))
            {
                rest = r;
                pre = Some((0, number(&mut rest)));
            } else if let Some(r) = rest.strip_prefix("beta").or_else(|| rest.strip_prefix('b')) {
                rest = r;
                pre = Some((1, number(&mut rest)));
            } else if let Some(r) = rest.strip_prefix("post") {
                rest = r;
                post = Some(number(&mut rest));
            } else if let Some(r) = rest.strip_prefix("dev") {
                rest = r;
                dev = Some(number(&mut rest));
            } else if rest.is_empty() {
                break;
            } else {
                return Err(bad());
            }
        }
        Ok(Self {
            release,
            pre,
            post,
            dev,
            text: text.to_string(),
        })
    }

    fn release_at(&self, i: usize) -> u64 {
        self.release.get(i).copied().unwrap_or(0)
    }

    fn is_prerelease(&self) -> bool {
        self.pre.is_some() || self.dev.is_some()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.release.len().max(other.release.len());
        for i in 0..n {
            match self.release_at(i).cmp(&other.release_at(i)) {
                Ordering::Equal => continue,
                o => return o,
            }
        }
        // Within one release: dev-only < pre-releases < the release < post-releases.
        let phase = |v: &Version| match (v.pre, v.post, v.dev) {
            (None, None, Some(_)) => (0u8, (0u8, 0u64)),
            (Some(p), _, _) => (1, p),
            (None, _, _) => (2, (0, 0)),
        };
        phase(self)
            .cmp(&phase(other))
            .then(
                self.post
                    .unwrap_or(0)
                    .cmp(&other.post.unwrap_or(0))
                    .then(self.post.is_some().cmp(&other.post.is_some())),
            )
            // A dev release comes before the same version without it.
            .then(match (self.dev, other.dev) {
                (Some(a), Some(b)) => a.cmp(&b),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Ge,
    Le,
    Gt,
    Lt,
    Compatible,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Clause {
    op: Op,
    version: Version,
    /// `==1.2.*`: compare only the release prefix.
    wildcard: bool,
}

/// A comma-separated list of clauses that must all hold; empty means any version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VersionSpec {
    clauses: Vec<Clause>,
    text: String,
}

impl VersionSpec {
    pub fn any() -> Self {
        Self {
            clauses: vec![],
            text: String::new(),
        }
    }

    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let text = s.trim();
        let mut clauses = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (op, rest) = [
                ("~=", Op::Compatible),
                ("==", Op::Eq),
                ("!=", Op::Ne),
                (">=", Op::Ge),
                ("<=", Op::Le),
                (">", Op::Gt),
                ("<", Op::Lt),
            ]
            .into_iter()
            .find_map(|(p, op)| part.strip_prefix(p).map(|r| (op, r.trim())))
            .ok_or_else(|| SpecError::BadVersionSpec(text.to_string()))?;
            let wildcard = rest.ends_with(".*");
            if wildcard && !matches!(op, Op::Eq | Op::Ne) {
                return Err(SpecError::BadVersionSpec(text.to_string()));
            }
            let version = Version::parse(rest.trim_end_matches(".*"))
                .map_err(|_| SpecError::BadVersionSpec(text.to_string()))?;
            if op == Op::Compatible && version.release.len() < 2 {
                return Err(SpecError::BadVersionSpec(text.to_string()));
            }
            clauses.push(Clause {
                op,
                version,
                wildcard,
            });
        }
        Ok(Self {
            clauses,
            text: text.to_string(),
        })
    }

    pub fn is_any(&self) -> bool {
        self.clauses.is_empty()
    }

    /// Whether `v` satisfies every clause. Pre-releases match only when a clause names one,
    /// as pip does.
    pub fn matches(&self, v: &Version) -> bool {
        if v.is_prerelease()
            && !self.clauses.iter().any(|c| c.version.is_prerelease())
            && !self.is_any()
        {
            return false;
        }
        self.clauses.iter().all(|c| c.matches(v))
    }
}

impl Clause {
    fn matches(&self, v: &Version) -> bool {
        let prefix_equal = || {
            (0..self.version.release.len()).all(|i| v.release_at(i) == self.version.release_at(i))
        };
        match self.op {
            Op::Eq if self.wildcard => prefix_equal(),
            Op::Ne if self.wildcard => !prefix_equal(),
            Op::Eq => v.cmp(&self.version) == Ordering::Equal,
            Op::Ne => v.cmp(&self.version) != Ordering::Equal,
            Op::Ge => v >= &self.version,
            Op::Le => v <= &self.version,
            Op::Gt => v > &self.version,
            Op::Lt => v < &self.version,
            Op::Compatible => {
                // ~=2.2.3 means >=2.2.3, ==2.2.*
                let n = self.version.release.len() - 1;
                v >= &self.version && (0..n).all(|i| v.release_at(i) == self.version.release_at(i))
            }
        }
    }
}

impl fmt::Display for VersionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl TryFrom<String> for VersionSpec {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, SpecError> {
        Self::parse(&s)
    }
}

impl From<VersionSpec> for String {
    fn from(v: VersionSpec) -> Self {
        v.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn versions_order_as_pep_440_says() {
        let ordered = [
            "1.0.dev1",
            "1.0a1",
            "1.0b2",
            "1.0rc1",
            "1.0",
            "1.0.post1",
            "1.0.1",
            "1.1",
            "2.0",
            "10.0",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(
            v("2.5.1+cpu").cmp(&v("2.5.1")),
            Ordering::Equal,
            "local labels do not order"
        );
        assert_eq!(v("1.0").cmp(&v("1.0.0")), Ordering::Equal);
        assert!(Version::parse("abc").is_err());
    }

    #[test]
    fn specifiers_match_like_pip() {
        let cases = [
            (">=0.4", "0.4.30", true),
            (">=0.4", "0.3.9", false),
            (">=0.10", "0.9.0", false),
            (">=0.10", "0.21.1", true),
            (">=2.0,<3", "2.5.1+cpu", true),
            (">=2.0,<3", "3.0", false),
            ("==2.5.*", "2.5.1", true),
            ("==2.5.*", "2.6.0", false),
            ("!=2.5.*", "2.6.0", true),
            ("~=2.2", "2.9", true),
            ("~=2.2", "3.0", false),
            ("~=2.2.3", "2.2.9", true),
            ("~=2.2.3", "2.3.0", false),
            (">=1.0", "2.0rc1", false),
            (">=2.0rc1", "2.0rc2", true),
            ("", "0.0.1", true),
            ("==1.0", "1.0.0", true),
        ];
        for (spec, version, expect) in cases {
            assert_eq!(
                VersionSpec::parse(spec).unwrap().matches(&v(version)),
                expect,
                "{version} in {spec:?}"
            );
        }
    }

    #[test]
    fn malformed_specifiers_are_refused_with_the_text() {
        for bad in ["=>1", ">=", "~=1", ">=1.*", "1.0"] {
            let err = VersionSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
