//! The sentinel: a small process forked when the worker starts, whose only job is to kill the
//! process groups of the worker's tasks if the worker dies without stopping them (`kill -9`,
//! the OOM killer). A task of a dead worker runs again elsewhere, so a survivor would be the
//! same work done twice.
//!
//! The worker tells it each group it starts and each group that is gone, in 5-byte records
//! over a pipe; the sentinel learns of the worker's death from the pipe's end-of-file (the
//! worker holds the only write end), kills every group still listed, and exits. Whole groups,
//! so a job's children and grandchildren go too, not just its leader. It reads the pipe
//! every `DRAIN_EVERY` rather than waiting on it: a reader blocked on a pipe is woken by every
//! write, two context switches per job on a busy worker.
//!
//! Why not `PR_SET_PDEATHSIG` in each job: setting it needs code in the child between fork
//! and exec, which rules out `posix_spawn`; forking the worker to start each job copied its
//! page tables and then took a copy-on-write fault for every page it touched, a tenth of the
//! machine's CPU on short jobs (measured). And it reached only the leader.

use nix::libc;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Groups the sentinel can track at once; far beyond any worker's slots.
const CAPACITY: usize = 4096;

/// How often the sentinel reads what the worker told it. Bounds how long a dead worker's
/// tasks outlive it; 20 reads a second cost nothing, and the pipe (64 KiB, 13,000 records)
/// cannot fill up in between.
const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

const WATCH: u8 = b'+';
const FORGET: u8 = b'-';

/// The worker's end of the pipe.
#[derive(Debug)]
pub struct Sentinel {
    pipe: Mutex<Option<std::fs::File>>,
    pid: nix::unistd::Pid,
}

impl Sentinel {
    /// Forks the sentinel. Call it early: it inherits this process as it is at the moment of
    /// the call (it closes every descriptor but its pipe at once).
    pub fn start() -> std::io::Result<Self> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // Only the sentinel's end is non-blocking: it drains the pipe, then sleeps.
        nix::fcntl::fcntl(
            &read_end,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        let groups = vec![0_i32; CAPACITY];
        match fork()? {
            Forked::Child => watch(read_end, groups),
            Forked::Parent(pid) => {
                drop(read_end);
                Ok(Self {
                    pipe: Mutex::new(Some(std::fs::File::from(write_end))),
                    pid,
                })
            }
        }
    }

    /// From now on, the group led by `pgid` is killed if the worker dies.
    pub fn watch(&self, pgid: u32) {
        self.send(WATCH, pgid);
    }

    /// The group led by `pgid` is gone; the sentinel must not kill a group that reuses its id.
    pub fn forget(&self, pgid: u32) {
        self.send(FORGET, pgid);
    }

    fn send(&self, op: u8, pgid: u32) {
        let mut record = [0_u8; 5];
        record[0] = op;
        record[1..].copy_from_slice(&pgid.to_le_bytes());
        // Five bytes are below PIPE_BUF: each write is whole, never interleaved.
        let mut pipe = self.pipe.lock().expect("sentinel lock");
        let Some(pipe) = pipe.as_mut() else { return };
        if let Err(e) = pipe.write_all(&record) {
            tracing::warn!(error = %e, "the sentinel is gone: a task of this worker may outlive it if it is killed");
        }
    }
}

impl Drop for Sentinel {
    /// The worker stopped its tasks itself: let the sentinel go, and reap it.
    fn drop(&mut self) {
        drop(self.pipe.lock().expect("sentinel lock").take());
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

enum Forked {
    Parent(nix::unistd::Pid),
    Child,
}

#[allow(unsafe_code)]
fn fork() -> std::io::Result<Forked> {
    // SAFETY: the child runs only `watch`, which calls async-signal-safe functions (read,
    // close, dup2, setpgid, kill, _exit) on memory allocated before the fork, as a child of
    // a multi-threaded process must.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child)),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// The sentinel's whole life. Never returns.
#[allow(unsafe_code)]
fn watch(pipe: OwnedFd, mut groups: Vec<i32>) -> ! {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: DRAIN_EVERY.as_nanos() as libc::c_long,
    };
    // SAFETY (the whole function): only async-signal-safe libc calls on plain integers and on
    // `groups` and `record`, which exist already; nothing allocates, nothing unwinds.
    unsafe {
        // Out of the terminal's foreground group, so Ctrl-C reaches the worker (which then
        // stops its tasks itself) and not the sentinel.
        libc::setpgid(0, 0);
        // Keep nothing of the worker's open but the pipe: a copy of a socket or of a task's
        // pipe held here would keep it open after the worker closed it.
        let fd = libc::dup2(pipe.as_raw_fd(), 3);
        if fd != 3 {
            libc::_exit(1);
        }
        if libc::syscall(libc::SYS_close_range, 4_u32, u32::MAX, 0_u32) != 0 {
            for other in 4..65_536 {
                libc::close(other);
            }
        }
        for std_fd in 0..3 {
            libc::close(std_fd);
        }
        let mut count = 0_usize;
        // Whole records only: writes of 5 bytes are atomic, and so is what is left unread.
        let mut buf = [0_u8; 5 * 820];
        loop {
            let n = libc::read(3, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 {
                // End of file: the worker is gone. Kill what it left running.
                for &pgid in &groups[..count] {
                    libc::kill(-pgid, libc::SIGKILL);
                }
                libc::_exit(0);
            }
            if n < 0 {
                let errno = *libc::__errno_location();
                if errno == libc::EAGAIN || errno == libc::EINTR {
                    libc::nanosleep(&pause, std::ptr::null_mut());
                    continue;
                }
                libc::_exit(1);
            }
            for record in buf[..n as usize].chunks_exact(5) {
                let pgid = i32::from_le_bytes([record[1], record[2], record[3], record[4]]);
                if pgid <= 1 {
                    continue;
                }
                match record[0] {
                    WATCH if count < groups.len() => {
                        groups[count] = pgid;
                        count += 1;
                    }
                    FORGET => {
                        if let Some(i) = groups[..count].iter().position(|&g| g == pgid) {
                            count -= 1;
                            groups[i] = groups[count];
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
