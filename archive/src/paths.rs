//! Path rules shared by packing and unpacking: bytewise ordering, archive-path hygiene and the
//! "does this symlink stay inside the tree" check.

use std::cmp::Ordering;
use std::path::{Component, Path, PathBuf};

/// Orders paths by their raw bytes.
///
/// `Path`'s own `Ord` compares component by component, which sorts `a/b` before `a.txt`; raw
/// bytes give the order `tar`, `ls` and other platforms agree on, and it never depends on locale.
pub(crate) fn bytewise(a: &Path, b: &Path) -> Ordering {
    a.as_os_str()
        .as_encoded_bytes()
        .cmp(b.as_os_str().as_encoded_bytes())
}

/// Sorts paths bytewise and drops exact duplicates.
pub(crate) fn sort_bytewise(paths: &mut Vec<PathBuf>) {
    paths.sort_by(|a, b| bytewise(a, b));
    paths.dedup();
}

/// Returns `path` as a plain relative path (only normal components, `.` dropped), or `None` when
/// it is empty, absolute or contains `..` — none of which may name an entry inside an archive.
pub(crate) fn clean_relative(path: &Path) -> Option<PathBuf> {
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(name) => clean.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if clean.as_os_str().is_empty() {
        None
    } else {
        Some(clean)
    }
}

/// Whether a symlink stored at `link` (a clean relative archive path) pointing at `target` stays
/// inside the archive's root once unpacked.
///
/// The check is lexical, so it has to be strict to be sound: `..` is only allowed as a prefix
/// (`../lib/x`), never after a normal component, because `dir/..` resolved through a symlinked
/// `dir` does not mean what it looks like. The leading `..`s may climb at most to the root.
pub(crate) fn symlink_stays_inside(link: &Path, target: &Path) -> bool {
    // The link's own directory depth: `a/b/link` lives two levels below the root.
    let depth = link.components().count().saturating_sub(1);
    let mut climbs = 0usize;
    let mut seen_normal = false;
    let mut any = false;
    for part in target.components() {
        any = true;
        match part {
            Component::CurDir => {}
            Component::Normal(_) => seen_normal = true,
            Component::ParentDir if !seen_normal => climbs += 1,
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    any && climbs <= depth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytewise_order_puts_dot_before_slash() {
        let mut paths: Vec<PathBuf> = ["a/b.txt", "a.txt", "B.txt", "a-b.txt", "a.txt"]
            .iter()
            .map(PathBuf::from)
            .collect();
        sort_bytewise(&mut paths);
        let expected: Vec<PathBuf> = ["B.txt", "a-b.txt", "a.txt", "a/b.txt"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(paths, expected);
    }

    #[test]
    fn clean_relative_drops_dots_and_refuses_escapes() {
        assert_eq!(
            clean_relative(Path::new("./a/./b")),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(clean_relative(Path::new("../evil")), None);
        assert_eq!(clean_relative(Path::new("a/../../evil")), None);
        assert_eq!(clean_relative(Path::new("/etc/passwd")), None);
        assert_eq!(clean_relative(Path::new(".")), None);
        assert_eq!(clean_relative(Path::new("")), None);
    }

    #[test]
    fn symlinks_may_climb_only_as_far_as_the_root() {
        assert!(symlink_stays_inside(
            Path::new("lib.so"),
            Path::new("lib.so.1")
        ));
        assert!(symlink_stays_inside(
            Path::new("a/b/link"),
            Path::new("../../top")
        ));
        assert!(symlink_stays_inside(
            Path::new("a/link"),
            Path::new("./../x/y")
        ));
        assert!(!symlink_stays_inside(
            Path::new("link"),
            Path::new("../outside")
        ));
        assert!(!symlink_stays_inside(
            Path::new("a/link"),
            Path::new("../../outside")
        ));
        assert!(!symlink_stays_inside(
            Path::new("link"),
            Path::new("/etc/passwd")
        ));
        assert!(!symlink_stays_inside(Path::new("link"), Path::new("")));
    }

    #[test]
    fn symlinks_may_not_climb_after_descending() {
        // `s/..` is only the root if `s` is a real directory; through a symlink it is anywhere.
        assert!(!symlink_stays_inside(
            Path::new("a/b/link"),
            Path::new("s/..")
        ));
        assert!(!symlink_stays_inside(
            Path::new("a/b/link"),
            Path::new("../x/../y")
        ));
    }
}
