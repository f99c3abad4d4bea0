//! The agent skill (`integrations/skills/gpulayer/SKILL.md`) stays valid and in step with the
//! CLI: its front matter is what skill loaders require, and every command and flag it shows
//! exists.

use crate::{bin, repo_root};
use std::collections::BTreeSet;

#[test]
fn the_skill_names_itself_after_its_folder_and_shows_only_real_commands_and_flags() {
    let dir = repo_root().join("integrations/skills/gpulayer");
    let text = std::fs::read_to_string(dir.join("SKILL.md")).unwrap();
    let front = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.split_once("\n---\n"))
        .map(|(f, _)| f)
        .expect("YAML front matter between --- lines");
    let field = |k: &str| {
        front
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}: ")))
            .unwrap_or_else(|| panic!("front matter has no {k}"))
    };
    assert_eq!(field("name"), dir.file_name().unwrap().to_str().unwrap());
    let description = field("description");
    assert!(
        !description.is_empty() && description.chars().count() <= 1024,
        "description: {} characters",
        description.chars().count()
    );

    // Every `gpulayer CMD ... --flag` line of its code blocks: CMD's --help lists the flag.
    let mut shown: BTreeSet<(String, String)> = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| l.trim_start().starts_with("gpulayer "))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        let cmd = words[1].to_string();
        shown.insert((cmd.clone(), String::new()));
        for w in words
            .iter()
            .skip(2)
            .take_while(|w| **w != "--" && **w != "#")
        {
            if let Some(flag) = w.strip_prefix("--") {
                let flag = flag.split('=').next().unwrap();
                shown.insert((cmd.clone(), format!("--{flag}")));
            }
        }
    }
    assert!(shown.len() > 10, "{shown:?}");
    for (cmd, flag) in shown {
        let out = std::process::Command::new(bin())
            .args([cmd.as_str(), "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "gpulayer {cmd} is not a command");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            flag.is_empty() || help.contains(&flag),
            "gpulayer {cmd} has no {flag}"
        );
    }
}
