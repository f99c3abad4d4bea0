//! What a user asks for: the command, where its source comes from, what to bring back.

use crate::Accelerator;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Everything a user can get wrong in a job spec, each with a message that says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "no command given: put the command after `--`, e.g. `gpulayer submit -- python3 train.py`"
    )]
    EmptyCommand,
    #[error("the command's first word is empty")]
    EmptyProgram,
    #[error("unknown accelerator '{0}': use one of cpu, cuda, mps, any")]
    UnknownAccelerator(String),
    #[error("'{0}' is not KEY=VALUE (e.g. --env SEED=1)")]
    EnvNotKeyValue(String),
    #[error(
        "'{0}' is not a valid environment variable name (letters, digits and _, not starting with a digit)"
    )]
    EnvBadName(String),
    #[error("environment variable {0} is set by GPUlayer and cannot be overridden")]
    EnvReserved(String),
    #[error(
        "output glob '{0}' must be a relative path inside the job's work directory (no leading / and no ..)"
    )]
    OutputNotRelative(String),
    #[error("output glob is empty")]
    OutputEmpty,
    #[error("'{0}' is not a sha256 digest (64 lowercase hex characters)")]
    BadDigest(String),
    #[error(
        "job name '{0}' is too long or has control characters (at most 128 printable characters)"
    )]
    BadName(String),
    #[error("'{0}' is not a version (e.g. 2.5.1)")]
    BadVersion(String),
    #[error(
        "'{0}' is not a version specifier (PEP 440: e.g. '>=0.4', '>=2,<3', '==2.5.*', '~=1.2')"
    )]
    BadVersionSpec(String),
    #[error("unknown framework '{0}': GPUlayer checks torch, jax, cupy and mlx")]
    UnknownFramework(String),
    #[error("framework spec '{0}' is not NAME[SPECIFIERS] (e.g. 'jax>=0.4' or 'torch>=2,<3')")]
    BadFramework(String),
    #[error("label selector '{0}' is not KEY=VALUE (e.g. --where zone=europe-west1-b)")]
    BadLabelSelector(String),
    #[error("'{0}' is not a device count (a whole number, 0 or more)")]
    BadDeviceCount(String),
    #[error("'{0}' is not a memory size (e.g. 40GiB, 512MiB)")]
    BadMemory(String),
    #[error("{0}")]
    Inconsistent(String),
    #[error("'{given}' is not a {what} id ({what} ids are numbers, as `gpulayer jobs` shows them)")]
    BadId { what: &'static str, given: String },
}

/// A non-empty argv: program plus arguments, run without a shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct Command(Vec<String>);

impl Command {
    pub fn parse(argv: Vec<String>) -> Result<Self, SpecError> {
        match argv.first() {
            None => Err(SpecError::EmptyCommand),
            Some(p) if p.is_empty() => Err(SpecError::EmptyProgram),
            Some(_) => Ok(Self(argv)),
        }
    }
    pub fn program(&self) -> &str {
        &self.0[0]
    }
    pub fn args(&self) -> &[String] {
        &self.0[1..]
    }
    pub fn argv(&self) -> &[String] {
        &self.0
    }
}

impl TryFrom<Vec<String>> for Command {
    type Error = SpecError;
    fn try_from(v: Vec<String>) -> Result<Self, SpecError> {
        Self::parse(v)
    }
}

impl From<Command> for Vec<String> {
    fn from(c: Command) -> Self {
        c.0
    }
}

impl fmt::Display for Command {
    /// Shell-like rendering for people: words with spaces or quotes are single-quoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                f.write_str(word)?;
            } else {
                write!(f, "'{}'", word.replace('\'', r"'\''"))?;
            }
        }
        Ok(())
    }
}

/// Variables GPUlayer sets itself; a job may read them but not set them.
pub const RESERVED_ENV: &[&str] = &[
    "GPULAYER_JOB_ID",
    "GPULAYER_OUTPUT_DIR",
    "GPULAYER_TASK_ID",
    "GPULAYER_ATTEMPT",
];

/// One `KEY=VALUE` for the job's environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "EnvVarWire", into = "EnvVarWire")]
pub struct EnvVar {
    name: String,
    value: String,
}

#[derive(Serialize, Deserialize)]
struct EnvVarWire {
    name: String,
    value: String,
}

impl TryFrom<EnvVarWire> for EnvVar {
    type Error = SpecError;
    fn try_from(w: EnvVarWire) -> Result<Self, SpecError> {
        Self::new(w.name, w.value)
    }
}

impl From<EnvVar> for EnvVarWire {
    fn from(e: EnvVar) -> Self {
        Self {
            name: e.name,
            value: e.value,
        }
    }
}

impl EnvVar {
    pub fn new(name: String, value: String) -> Result<Self, SpecError> {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(SpecError::EnvBadName(name));
        }
        if RESERVED_ENV.contains(&name.as_str()) {
            return Err(SpecError::EnvReserved(name));
        }
        Ok(Self { name, value })
    }

    /// Parses `KEY=VALUE` as given on the command line.
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| SpecError::EnvNotKeyValue(s.to_string()))?;
        Self::new(name.to_string(), value.to_string())
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// A glob of files to bring back, relative to the job's work directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OutputGlob(String);

impl OutputGlob {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SpecError::OutputEmpty);
        }
        if s.starts_with('/') || s.split(['/', '\\']).any(|part| part == "..") {
            return Err(SpecError::OutputNotRelative(s.to_string()));
        }
        Ok(Self(s.trim_start_matches("./").to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for OutputGlob {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, SpecError> {
        Self::parse(&s)
    }
}

impl From<OutputGlob> for String {
    fn from(g: OutputGlob) -> Self {
        g.0
    }
}

/// A sha256 content digest, lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let ok = s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(SpecError::BadDigest(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The first 12 characters, enough for people to tell sources apart.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl TryFrom<String> for Digest {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, SpecError> {
        Self::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> Self {
        d.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A packed source directory stored in the object store under its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    pub digest: Digest,
    pub bytes: u64,
    pub files: u64,
}

/// A human label for a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobName(String);

impl JobName {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        if s.is_empty() || s.chars().count() > 128 || s.chars().any(char::is_control) {
            return Err(SpecError::BadName(s.to_string()));
        }
        Ok(Self(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JobName {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, SpecError> {
        Self::parse(&s)
    }
}

impl From<JobName> for String {
    fn from(n: JobName) -> Self {
        n.0
    }
}

/// A command job as submitted. Deserializing one validates every part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    #[serde(default)]
    pub name: Option<JobName>,
    pub command: Command,
    pub accelerator: Accelerator,
    #[serde(default)]
    pub source: Option<SourceRef>,
    #[serde(default)]
    pub outputs: Vec<OutputGlob>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub requirements: crate::Requirements,
    /// How many times the job may be run again after its worker is lost (default 3).
    #[serde(default)]
    pub retries: Option<u32>,
    /// Also retry when the job itself fails (a non-zero exit), not only when its worker is lost.
    #[serde(default)]
    pub retry_failed: bool,
    /// Higher runs first; jobs of one priority run in submit order.
    #[serde(default)]
    pub priority: i32,
    /// The longest one attempt may run before it is stopped and fails.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Nodes, processes per node, and how far apart the nodes may be (one process on one
    /// node unless asked).
    #[serde(default)]
    pub layout: crate::Layout,
    /// A remote Python function call (`@gl.remote`): the worker runs it in one of its warm
    /// Python runners instead of starting `command` (which then only names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<CallSpec>,
}

/// The largest pickled arguments a call carries inline (base64 in the job's spec).
pub const MAX_CALL_ARGS_BYTES: usize = 1 << 20;

/// One call of a remote function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    /// The cloudpickled function, stored as a blob (uploaded once per function).
    pub function: Digest,
    /// The cloudpickled `(args, kwargs)`, base64.
    pub args: String,
    /// The caller's Python `major.minor`: cloudpickle's output is only read back by the
    /// same minor version, so only workers running it may take the call.
    pub python: String,
}

/// How a remote call ended, as its runner reports it: the pickled return value, or what it
/// raised (type, module, message, traceback, and the pickled exception when it pickles).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub ok: bool,
    /// The pickled value (ok) or exception, base64.
    #[serde(default)]
    pub payload: Option<String>,
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

impl CallSpec {
    /// `major.minor` of a Python version string (`3.11.7` -> `3.11`).
    pub fn minor_of(version: &str) -> Option<&str> {
        let mut parts = version.splitn(3, '.');
        let (major, minor) = (parts.next()?, parts.next()?);
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(major) && digits(minor)).then(|| &version[..major.len() + 1 + minor.len()])
    }
}

/// Retries when a job does not say: a lost machine is not the job's fault, so try again, but
/// not forever.
pub const DEFAULT_RETRIES: u32 = 3;

/// More retries than this is a loop, not resilience.
pub const MAX_RETRIES: u32 = 100;

impl JobSpec {
    /// How many times the job may run in all.
    pub fn max_attempts(&self) -> u32 {
        1 + self.retries.unwrap_or(DEFAULT_RETRIES)
    }

    /// Devices of the job's kind each node needs: `--devices` if given, else one per
    /// process for device kinds (none for cpu and any).
    pub fn devices_per_node(&self) -> u32 {
        match (self.requirements.devices, self.accelerator.needs_device()) {
            (Some(n), true) => n,
            (None, true) => self.layout.procs_per_node,
            (_, false) => 0,
        }
    }

    /// True when the job asks a worker for nothing but its accelerator kind: one node, no
    /// devices, frameworks or labels. Every online worker offering the kind can run it, so
    /// the queue claims such jobs without asking the scheduler about each.
    pub fn is_plain(&self) -> bool {
        // A call also needs the caller's Python version (see `CallSpec::python`).
        self.call.is_none()
            && !self.layout.is_gang()
            && self.devices_per_node() == 0
            && self.requirements.frameworks.is_empty()
            && self.requirements.labels.is_empty()
    }

    /// For a remote call that asks for nothing but its kind (and its caller's Python), that
    /// Python's `major.minor`: such calls may be queued on a worker beyond its free slots.
    pub fn queueable_call(&self) -> Option<&str> {
        let call = self.call.as_ref()?;
        let only_the_kind = !self.layout.is_gang()
            && self.devices_per_node() == 0
            && self.requirements.frameworks.is_empty()
            && self.requirements.labels.is_empty();
        only_the_kind.then_some(call.python.as_str())
    }

    /// Checks the parts against each other (each part was checked when it was parsed).
    pub fn check(&self) -> Result<(), SpecError> {
        if let Some(call) = &self.call {
            if CallSpec::minor_of(&call.python) != Some(call.python.as_str()) {
                return Err(SpecError::Inconsistent(format!(
                    "a call's python must be major.minor (like 3.11), not {:?}",
                    call.python
                )));
            }
            if call.args.len() > MAX_CALL_ARGS_BYTES * 4 / 3 + 4 {
                return Err(SpecError::Inconsistent(format!(
                    "a call's pickled arguments are larger than {} MiB: pass large data as a file (source or outputs) instead",
                    MAX_CALL_ARGS_BYTES >> 20
                )));
            }
            if self.layout.is_distributed() {
                return Err(SpecError::Inconsistent(
                    "a remote function call runs on one node in one process".into(),
                ));
            }
        }
        if self.timeout_seconds == Some(0) {
            return Err(SpecError::Inconsistent(
                "--timeout must be at least 1 second".into(),
            ));
        }
        if self.retries.is_some_and(|r| r > MAX_RETRIES) {
            return Err(SpecError::Inconsistent(format!(
                "--retries is at most {MAX_RETRIES}"
            )));
        }
        let r = &self.requirements;
        if let Some(n) = r.devices {
            if n > 0 && !self.accelerator.needs_device() {
                return Err(SpecError::Inconsistent(format!(
                    "--devices {n} needs a device kind: add --accelerator cuda or --accelerator mps"
                )));
            }
            if n == 0 && self.accelerator.needs_device() {
                return Err(SpecError::Inconsistent(format!(
                    "--devices 0 with --accelerator {}: ask for at least 1 device, or use --accelerator cpu",
                    self.accelerator
                )));
            }
        }
        if r.min_device_memory_bytes.is_some() && !self.accelerator.needs_device() {
            return Err(SpecError::Inconsistent(
                "--min-device-memory needs a device kind: add --accelerator cuda or --accelerator mps".into(),
            ));
        }
        let layout = self.layout;
        layout.check()?;
        let (devices, procs) = (self.devices_per_node(), layout.procs_per_node);
        if devices > 0 && devices % procs != 0 {
            return Err(SpecError::Inconsistent(format!(
                "--devices {devices} cannot be shared by --procs-per-node {procs}: each process gets its own devices, so ask for a multiple of {procs}"
            )));
        }
        if layout.is_distributed()
            && let Some(e) = self
                .env
                .iter()
                .find(|e| crate::layout::RANK_ENV.contains(&e.name()))
        {
            return Err(SpecError::Inconsistent(format!(
                "{} is set by GPUlayer for each process of a job with --nodes or --procs-per-node: leave it out",
                e.name()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn commands_need_a_program() {
        assert_eq!(Command::parse(vec![]), Err(SpecError::EmptyCommand));
        assert_eq!(Command::parse(argv(&[""])), Err(SpecError::EmptyProgram));
        let c = Command::parse(argv(&["python3", "-c", "print('hi there')"])).unwrap();
        assert_eq!(c.program(), "python3");
        assert_eq!(c.to_string(), r#"python3 -c 'print('\''hi there'\'')'"#);
    }

    #[test]
    fn env_vars_parse_or_say_why_not() {
        type Expect = Result<(&'static str, &'static str), SpecError>;
        let cases: &[(&str, Expect)] = &[
            ("SEED=1", Ok(("SEED", "1"))),
            ("A_B=x=y", Ok(("A_B", "x=y"))),
            ("EMPTY=", Ok(("EMPTY", ""))),
            (
                "NOEQUALS",
                Err(SpecError::EnvNotKeyValue("NOEQUALS".into())),
            ),
            ("1X=2", Err(SpecError::EnvBadName("1X".into()))),
            ("A-B=2", Err(SpecError::EnvBadName("A-B".into()))),
            (
                "GPULAYER_JOB_ID=3",
                Err(SpecError::EnvReserved("GPULAYER_JOB_ID".into())),
            ),
        ];
        for (input, expect) in cases {
            let got = EnvVar::parse(input).map(|e| (e.name().to_string(), e.value().to_string()));
            let expect = expect.clone().map(|(n, v)| (n.to_string(), v.to_string()));
            assert_eq!(got, expect, "{input}");
        }
    }

    #[test]
    fn output_globs_stay_inside_the_work_directory() {
        assert_eq!(
            OutputGlob::parse("./out/*.pt").unwrap().as_str(),
            "out/*.pt"
        );
        assert!(OutputGlob::parse("/etc/passwd").is_err());
        assert!(OutputGlob::parse("a/../../b").is_err());
        assert!(OutputGlob::parse("  ").is_err());
    }

    #[test]
    fn digests_are_64_lowercase_hex() {
        let d = "a".repeat(64);
        assert_eq!(Digest::parse(&d).unwrap().short(), "aaaaaaaaaaaa");
        assert!(Digest::parse(&"A".repeat(64)).is_err());
        assert!(Digest::parse("abc").is_err());
    }

    #[test]
    fn a_spec_that_fails_validation_does_not_deserialize() {
        let bad = r#"{"command": [], "accelerator": "cpu"}"#;
        let err = serde_json::from_str::<JobSpec>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no command given"), "{err}");
        let good =
            r#"{"command": ["true"], "accelerator": "any", "env": [{"name": "A", "value": "1"}]}"#;
        let spec: JobSpec = serde_json::from_str(good).unwrap();
        assert_eq!(spec.env[0].value(), "1");
    }
}
