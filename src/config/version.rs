//! HAProxy versions: the minimum a configuration states and what a pod's HAProxy reports.

use std::fmt;

/// An HAProxy version as far as compatibility goes: major, minor and patch numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HaproxyVersion {
    /// `2` in 2.8.25.
    pub major: u32,
    /// `8` in 2.8.25.
    pub minor: u32,
    /// `25` in 2.8.25 (0 when not given).
    pub patch: u32,
}

impl HaproxyVersion {
    /// Reads the leading numbers of `2.8`, `2.8.25`, `2.6.12-1+deb12u4` or `2.8.25-5cf5d0683`
    /// (what HAProxy's runtime reports); `None` without at least a major and a minor.
    pub fn parse(text: &str) -> Option<Self> {
        let numeric = text.trim().split(['-', '+', ' ']).next().unwrap_or_default();
        let mut parts = numeric.split('.');
        let mut number = || parts.next().map(|part| part.parse::<u32>().ok());
        let major = number()??;
        let minor = number()??;
        let patch = match number() {
            None => 0,
            Some(patch) => patch?,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Self { major, minor, patch })
    }
}

impl fmt::Display for HaproxyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Whether a pod whose HAProxy reports `reported` (`None`: could not be read) may be given a
/// configuration requiring `minimum`: `Err` says why not, in words for the pod's status.
pub fn meets_minimum(reported: Option<&str>, minimum: Option<HaproxyVersion>) -> Result<(), BelowMinimum> {
    let Some(minimum) = minimum else { return Ok(()) };
    match reported {
        None => Err(BelowMinimum::Unread { minimum }),
        Some(text) => match HaproxyVersion::parse(text) {
            Some(version) if version >= minimum => Ok(()),
            Some(_) => Err(BelowMinimum::Older { reported: text.to_owned(), minimum }),
            None => Err(BelowMinimum::NotAVersion { reported: text.to_owned(), minimum }),
        },
    }
}

/// Why a pod is not given a configuration that requires a newer HAProxy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BelowMinimum {
    /// Its version could not be read.
    #[error(
        "refused: the pod's HAProxy version could not be read, and the configuration requires HAProxy {minimum} or later (minimumHAProxyVersion)"
    )]
    Unread {
        /// What the configuration requires.
        minimum: HaproxyVersion,
    },
    /// It runs an older one.
    #[error(
        "refused: the pod runs HAProxy {reported}, older than {minimum}, the configuration's minimumHAProxyVersion; nothing is deployed to it"
    )]
    Older {
        /// What it reports.
        reported: String,
        /// What the configuration requires.
        minimum: HaproxyVersion,
    },
    /// It reports something that is not a version.
    #[error(
        "refused: the pod's HAProxy reports version {reported:?}, which is not a version number, and the configuration requires HAProxy {minimum} or later (minimumHAProxyVersion)"
    )]
    NotAVersion {
        /// What it reports.
        reported: String,
        /// What the configuration requires.
        minimum: HaproxyVersion,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> HaproxyVersion {
        HaproxyVersion { major, minor, patch }
    }

    #[test]
    fn versions_are_read_from_what_haproxy_and_operators_write() {
        assert_eq!(HaproxyVersion::parse("2.8"), Some(v(2, 8, 0)));
        assert_eq!(HaproxyVersion::parse("2.8.25"), Some(v(2, 8, 25)));
        assert_eq!(HaproxyVersion::parse("2.6.12-1+deb12u4"), Some(v(2, 6, 12)));
        assert_eq!(HaproxyVersion::parse("2.8.25-5cf5d0683"), Some(v(2, 8, 25)));
        assert_eq!(HaproxyVersion::parse("3.1-dev4"), Some(v(3, 1, 0)));
        for bad in ["", "2", "2.", "two.eight", "2.8.1.4", "2.x"] {
            assert_eq!(HaproxyVersion::parse(bad), None, "{bad:?}");
        }
        assert!(v(2, 10, 0) > v(2, 8, 25), "numbers compare as numbers");
    }

    #[test]
    fn a_pod_below_the_minimum_or_of_unknown_version_is_refused_with_both_versions_named() {
        let minimum = HaproxyVersion::parse("2.7");
        assert_eq!(meets_minimum(Some("2.8.25-5cf5d0683"), minimum), Ok(()));
        assert_eq!(meets_minimum(Some("2.7.0"), minimum), Ok(()));
        assert_eq!(meets_minimum(None, None), Ok(()), "no minimum, no question");
        let old = meets_minimum(Some("2.6.12-1+deb12u4"), minimum).unwrap_err().to_string();
        assert!(old.contains("2.6.12-1+deb12u4") && old.contains("2.7.0"), "{old}");
        assert!(meets_minimum(None, minimum).unwrap_err().to_string().contains("could not be read"));
        assert!(meets_minimum(Some("dev"), minimum).is_err());
    }
}
