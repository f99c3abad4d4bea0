//! Bad input gets one clear line on stderr, a non-zero exit, and leaves nothing behind.

use crate::{bin, server};
use testkit::{Cli, ServerOptions};

pub(crate) fn one_line_error(out: &testkit::CliOutput, expect: &str) {
    assert_ne!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {:?}", out.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(
        lines[0].contains(expect),
        "expected '{expect}' in: {}",
        lines[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_with_one_line_and_nothing_is_submitted() {
    let server = server(ServerOptions::default()).await;
    let cli = server.cli();
    let file = server.data_dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["submit".into()], "no command given"),
        (
            vec!["submit".into(), "--".into(), "".into()],
            "first word is empty",
        ),
        (
            vec!["status".into(), "12345".into()],
            "job 12345 does not exist",
        ),
        (vec!["status".into(), "abc".into()], "'abc' is not a job id"),
        (
            vec![
                "submit".into(),
                "--source".into(),
                "/no/such/dir".into(),
                "--".into(),
                "true".into(),
            ],
            "--source /no/such/dir does not exist",
        ),
        (
            vec![
                "submit".into(),
                "--source".into(),
                file.display().to_string(),
                "--".into(),
                "true".into(),
            ],
            "is not a directory",
        ),
        (
            vec![
                "submit".into(),
                "--accelerator".into(),
                "tpu".into(),
                "--".into(),
                "true".into(),
            ],
            "unknown accelerator 'tpu'",
        ),
        (
            vec!["jobs".into(), "--state".into(), "done".into()],
            "unknown job state 'done'",
        ),
        (
            vec!["download".into(), "777".into()],
            "job 777 does not exist",
        ),
    ];
    for (args, expect) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        one_line_error(&cli.run(&args), expect);
    }
    let jobs = cli.run(&["jobs", "--json"]).success().json();
    assert_eq!(
        jobs["jobs"].as_array().unwrap().len(),
        0,
        "nothing was submitted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_or_missing_token_says_which_setting_to_fix() {
    let server = server(ServerOptions::default()).await;
    let wrong = Cli {
        token: "glc_wrong".into(),
        ..server.cli()
    };
    one_line_error(&wrong.run(&["jobs"]), "rejected the token");
    one_line_error(&wrong.run(&["jobs"]), "fix GPULAYER_TOKEN");

    let out = std::process::Command::new(bin())
        .args(["jobs"])
        .env_remove("GPULAYER_TOKEN")
        .env("GPULAYER_URL", &server.url)
        .env(
            "XDG_CONFIG_HOME",
            server.data_dir.path().join("empty-config"),
        )
        .output()
        .unwrap();
    let out = testkit::CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    one_line_error(&out, "no token configured");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_server_is_named_in_the_error() {
    let cli = Cli {
        bin: bin(),
        url: "http://127.0.0.1:9".into(),
        token: "glc_x".into(),
        fingerprint: None,
        config_home: std::env::temp_dir().join("gpulayer-no-config"),
    };
    one_line_error(
        &cli.run(&["jobs"]),
        "cannot reach the GPUlayer server at http://127.0.0.1:9",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_file_in_the_source_is_named() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let server = server(ServerOptions::default()).await;
    // Root reads a mode-000 file, so as root the CLI runs as `nobody`, from a copy of the
    // binary in a directory `nobody` can enter.
    let root = nix::unistd::geteuid().is_root();
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = open.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("fine.txt"), "x").unwrap();
    let secret = src.join("secret.txt");
    std::fs::write(&secret, "x").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let program = if root {
        let copy = open.path().join("gpulayer");
        std::fs::copy(bin(), &copy).unwrap();
        copy
    } else {
        bin()
    };
    let mut cmd = std::process::Command::new(&program);
    cmd.args(["submit", "--source", src.to_str().unwrap(), "--", "true"])
        .env("GPULAYER_URL", &server.url)
        .env("GPULAYER_TOKEN", &server.admin_token)
        .env(
            "GPULAYER_FINGERPRINT",
            server.fingerprint.as_deref().unwrap(),
        )
        .env("HOME", open.path())
        .env("TMPDIR", open.path())
        .current_dir(open.path());
    if root {
        // 65534 is `nobody` on Debian and most distributions.
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    let out = testkit::CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    one_line_error(&out, "cannot read secret.txt");
    let jobs = server.cli().run(&["jobs", "--json"]).success().json();
    assert_eq!(
        jobs["jobs"].as_array().unwrap().len(),
        0,
        "nothing was submitted"
    );
}
