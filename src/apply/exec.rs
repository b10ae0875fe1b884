//! Running external rule tools. One seam ([`Executor`]) so the apply logic can be driven by the real
//! processes or by a scripted fake in tests.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::netns::UsernsEntry;

/// One command to run: program, arguments, optional stdin, extra environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Option<String>,
    pub env: Vec<(String, String)>,
}

impl Cmd {
    pub fn new(program: &str, args: impl IntoIterator<Item = impl Into<String>>) -> Cmd {
        Cmd {
            program: program.to_string(),
            args: args.into_iter().map(Into::into).collect(),
            stdin: None,
            env: vec![],
        }
    }

    pub fn with_stdin(mut self, stdin: String) -> Cmd {
        self.stdin = Some(stdin);
        self
    }

    /// The command line as a person would type it (for logs and errors).
    pub fn display(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What a finished command printed and how it exited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdOutput {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Why a command could not be run at all.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {command}: {source}")]
pub struct SpawnError {
    pub command: String,
    #[source]
    pub source: std::io::Error,
}

/// Runs commands.
pub trait Executor {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError>;

    /// The user namespace a netlink transaction made for this executor's work must enter too
    /// (a `hostUsers: false` pod's netns); None for the caller's own.
    fn userns(&self) -> Option<&UsernsEntry> {
        None
    }
}

/// Runs real processes (in the calling thread's network namespace; with a [`UsernsEntry`], each
/// child first enters the user namespace owning the pod's netns, then that netns).
#[derive(Debug, Default)]
pub struct ProcessExecutor {
    userns: Option<UsernsEntry>,
}

impl ProcessExecutor {
    pub fn entering(userns: Option<UsernsEntry>) -> ProcessExecutor {
        ProcessExecutor { userns }
    }
}

impl Executor for ProcessExecutor {
    fn userns(&self) -> Option<&UsernsEntry> {
        self.userns.as_ref()
    }

    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        let spawn_err = |source| SpawnError {
            command: match &self.userns {
                Some(entry) => format!(
                    "{} (entering the user namespace owning {})",
                    cmd.display(),
                    entry.path().display()
                ),
                None => cmd.display(),
            },
            source,
        };
        let mut command = Command::new(&cmd.program);
        command
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(entry) = &self.userns {
            entry.prepare(&mut command);
        }
        let mut child = command.spawn().map_err(spawn_err)?;
        if let (Some(input), Some(mut pipe)) = (&cmd.stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).map_err(spawn_err)?;
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        Ok(CmdOutput {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
